"""What the JSON checks of ci/spdk/*.py share (imported, not run): the way a check fails,
and the calls of a saved SPDK config."""
import os
import sys


def run(main):
    """Runs a check's `main`: a failed assertion exits 1 with the check's name and what
    was wrong, not a traceback."""
    name = os.path.splitext(os.path.basename(sys.argv[0]))[0]
    try:
        main()
    except AssertionError as e:
        sys.exit("%s: %s" % (name, e))


def calls(config, method):
    """The params of every call of `method` in a saved config (save_config's JSON), in
    every subsystem, in order."""
    return [c["params"] for s in config["subsystems"] for c in (s["config"] or [])
            if c["method"] == method]
