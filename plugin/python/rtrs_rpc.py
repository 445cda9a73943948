#  SPDX-License-Identifier: BSD-3-Clause
"""rpc.py plugin for the rtrs-spdk plugin (librtrs_spdk.so).

The client side (the ``rtrs`` bdev module: ``bdev_rtrs_*``) and the server side (the
RTRS target backend: ``rtrs_target_*``) of RTRS/RNBD inside SPDK applications.

Use with SPDK's scripts/rpc.py::

    PYTHONPATH=$PYTHONPATH:plugin/python \\
        scripts/rpc.py -s /var/tmp/spdk.sock --plugin rtrs_rpc bdev_rtrs_create \\
        -b rtrs0 -n sess0 -d malloc0 -p tcp:127.0.0.1:1234

or with the PyPI ``spdk`` package (``spdk-rpc --plugin rtrs_rpc ...``). The functions
named after each method (``bdev_rtrs_create(client, ...)`` ...) take any client object
with a ``call(method, params)`` method: ``spdk.rpc.client.JSONRPCClient`` from SPDK's
tree or from PyPI.
"""

import json

DEFAULT_PORT = 1234
TRANSPORTS = ('tcp', 'rdma')
ACCESS_MODES = ('ro', 'rw', 'migration')
MP_POLICIES = ('round-robin', 'min-inflight', 'min-latency')
WRITE_ZEROES_MODES = ('native', 'emulate')


def _print_json(obj):
    print(json.dumps(obj, indent=2).strip('"'))


def _drop_none(params):
    return {k: v for k, v in params.items() if v is not None}


def parse_path(text, psk=None):
    """Turn ``transport:[src_addr@]dst_addr[:port][,psk=NAME]`` into the JSON object of a
    path.

    IPv6 addresses go in brackets: ``tcp:[::1]:1234``. The transport defaults to tcp
    when the text starts with an address. ``psk=NAME`` names a key in SPDK's keyring that
    authenticates the path; `psk` is the key of a path that names none.
    """
    text, _, opts = text.partition(',')
    for opt in filter(None, opts.split(',')):
        key, sep, value = opt.partition('=')
        if key != 'psk' or not sep or not value:
            raise ValueError("path %r: unknown option %r (known: psk=NAME)" % (text, opt))
        psk = value
    transport = 'tcp'
    rest = text
    head, sep, tail = text.partition(':')
    if sep and head in TRANSPORTS:
        transport, rest = head, tail
    src = None
    if '@' in rest:
        src, rest = rest.split('@', 1)
    port = None
    if rest.startswith('['):
        host, _, after = rest[1:].partition(']')
        if after.startswith(':'):
            port = after[1:]
    elif rest.count(':') == 1:
        host, port = rest.split(':')
    else:
        host = rest
    if not host:
        raise ValueError("path %r: no destination address" % text)
    path = {'transport': transport, 'dst_addr': host}
    if port:
        path['port'] = int(port)
    if src:
        path['src_addr'] = src.strip('[]')
    if psk:
        path['psk'] = psk
    return path


# ---- functions over a client (SPDK's python/spdk/rpc style) -------------------------

def bdev_rtrs_create(client, name, sessname, paths, device, access_mode=None, mp_policy=None,
                     max_reconnect_attempts=None, reconnect_delay_sec=None,
                     hb_interval_ms=None, hb_missed_max=None, io_timeout_sec=None,
                     write_zeroes=None, loss_timeout_sec=None):
    """Create an rtrs bdev mapping the remote RNBD device `device` over session `sessname`.

    Args:
        name: name of the new bdev
        sessname: RTRS session name sent to the target
        paths: list of {transport, dst_addr, port?, src_addr?, psk?} (psk: the name of a
            key in SPDK's keyring, e.g. added with keyring_file_add_key; tcp only)
        device: name of the export on the target
        access_mode: ro, rw (default) or migration
        mp_policy: round-robin, min-inflight (default) or min-latency
        max_reconnect_attempts: -1 forever (default), 0 never, N attempts
        reconnect_delay_sec: wait before a reconnect attempt
        hb_interval_ms: heartbeat interval
        hb_missed_max: heartbeats missed before a path is declared dead
        io_timeout_sec: how long IO waits while the device is unreachable (no path
            connected, or not re-opened yet after a reconnect) before it fails
        write_zeroes: emulate (default: zero-filled writes, safe with every target) or
            native (RNBD op 5: only for targets on Linux 6.8+ or rtrs targets; kernels
            before 5.18 read op 5 as WRITE_SAME)
        loss_timeout_sec: seconds the session may have no path before its bdevs fail
            their IO and are unregistered (bdev_nvme's ctrlr_loss_timeout_sec);
            -1 never (default)
    Returns:
        Name of the created bdev (answered once the session is up and the device open).
    """
    params = _drop_none({
        'name': name, 'sessname': sessname, 'paths': paths, 'device': device,
        'access_mode': access_mode, 'mp_policy': mp_policy,
        'max_reconnect_attempts': max_reconnect_attempts,
        'reconnect_delay_sec': reconnect_delay_sec, 'hb_interval_ms': hb_interval_ms,
        'hb_missed_max': hb_missed_max, 'io_timeout_sec': io_timeout_sec,
        'write_zeroes': write_zeroes, 'loss_timeout_sec': loss_timeout_sec,
    })
    return client.call('bdev_rtrs_create', params)


def bdev_rtrs_delete(client, name):
    """Delete an rtrs bdev (closes the device; the session closes with its last device)."""
    return client.call('bdev_rtrs_delete', {'name': name})


def bdev_rtrs_get_sessions(client, name=None):
    """Sessions of rtrs bdevs, each once with its devices: paths, states, cur_latency and
    statistics (name: only the session of that bdev)."""
    return client.call('bdev_rtrs_get_sessions', _drop_none({'name': name}))


def bdev_rtrs_add_path(client, name, transport, dst_addr, port=None, src_addr=None, psk=None):
    """Add a path to the session of an rtrs bdev, for every device of that session
    (psk: a keyring key's name, tcp only)."""
    return client.call('bdev_rtrs_add_path', _drop_none({
        'name': name, 'transport': transport, 'dst_addr': dst_addr, 'port': port,
        'src_addr': src_addr, 'psk': psk}))


def bdev_rtrs_remove_path(client, name, transport, dst_addr, port=None, src_addr=None):
    """Remove a path from the session of an rtrs bdev, for every device of that session
    (its IO fails over first)."""
    return client.call('bdev_rtrs_remove_path', _drop_none({
        'name': name, 'transport': transport, 'dst_addr': dst_addr, 'port': port,
        'src_addr': src_addr}))


def bdev_rtrs_disconnect_path(client, name, transport, dst_addr, port=None, src_addr=None):
    """Disconnect one path of an rtrs bdev's session now (its IO fails over); it stays
    closed until bdev_rtrs_reconnect_path (rtrs-clt's per-path `disconnect`)."""
    return client.call('bdev_rtrs_disconnect_path', _drop_none({
        'name': name, 'transport': transport, 'dst_addr': dst_addr, 'port': port,
        'src_addr': src_addr}))


def bdev_rtrs_reconnect_path(client, name, transport, dst_addr, port=None, src_addr=None):
    """Reconnect one path of an rtrs bdev's session now, its attempt count reset
    (rtrs-clt's per-path `reconnect`)."""
    return client.call('bdev_rtrs_reconnect_path', _drop_none({
        'name': name, 'transport': transport, 'dst_addr': dst_addr, 'port': port,
        'src_addr': src_addr}))


def bdev_rtrs_set_session_options(client, name, max_reconnect_attempts=None,
                                  reconnect_delay_sec=None, loss_timeout_sec=None):
    """Change the run-time settings of an rtrs bdev's session (every device of it):
    max_reconnect_attempts (-1 forever, 0 never, N), reconnect_delay_sec, loss_timeout_sec
    (-1 never, else seconds without a path before the bdevs fail their IO and are
    unregistered). save_config keeps them."""
    return client.call('bdev_rtrs_set_session_options', _drop_none({
        'name': name, 'max_reconnect_attempts': max_reconnect_attempts,
        'reconnect_delay_sec': reconnect_delay_sec, 'loss_timeout_sec': loss_timeout_sec}))


def bdev_rtrs_remap(client, name):
    """OPEN an rtrs bdev's device again (the kernel client's remap_device and resize):
    the bdev takes the size the target has now, and a device the target closed is mapped
    again if the target allows it. Returns the device's id and size."""
    return client.call('bdev_rtrs_remap', {'name': name})


def bdev_rtrs_set_mp_policy(client, name, mp_policy):
    """Switch the multipath policy of an rtrs bdev's session (every device of it)."""
    return client.call('bdev_rtrs_set_mp_policy', {'name': name, 'mp_policy': mp_policy})


def bdev_rtrs_reset_stats(client, name):
    """Zero the statistics of an rtrs bdev's session (the kernel's reset_all)."""
    return client.call('bdev_rtrs_reset_stats', {'name': name})


def rtrs_target_set_options(client, always_invalidate=None, queue_depth=None, chunk_size=None,
                            handshake_timeout_ms=None, max_pending=None,
                            max_pending_per_source=None, max_sessions=None,
                            max_sessions_per_source=None, open_grace_ms=None,
                            max_path_connections=None, max_connections=None,
                            max_connections_per_source=None):
    """Set RTRS target options (before the first listener).

    Args:
        always_invalidate: new rkey per IO (default true)
        queue_depth: session queue depth (default 512)
        chunk_size: chunk size in bytes (default 131072)
        handshake_timeout_ms: close connections whose handshake is not done in this
            time (default 5000)
        max_pending: most connections still in their handshake per listener (default 256)
        max_pending_per_source: most of them from one source address (default 32)
        max_sessions: most established sessions, each holding queue_depth x chunk_size
            bytes of chunks (default 0: as many as fit in a quarter of the memory, 4..1024)
        max_sessions_per_source: most established sessions from one source address
            (IPv6: one /64; default 16)
        open_grace_ms: how long a session with no device open keeps its slot (default
            10000); at a cap such sessions give way to new ones at once
        max_path_connections: most connections one path may ask for (default 513)
        max_connections: most connections in all (default 0: derived from the memory and
            the file descriptors left)
        max_connections_per_source: most connections from one source address (default 0:
            half of max_connections)
    """
    return client.call('rtrs_target_set_options', _drop_none({
        'always_invalidate': always_invalidate, 'queue_depth': queue_depth,
        'chunk_size': chunk_size, 'handshake_timeout_ms': handshake_timeout_ms,
        'max_pending': max_pending, 'max_pending_per_source': max_pending_per_source,
        'max_sessions': max_sessions, 'max_sessions_per_source': max_sessions_per_source,
        'open_grace_ms': open_grace_ms, 'max_path_connections': max_path_connections,
        'max_connections': max_connections,
        'max_connections_per_source': max_connections_per_source}))


def rtrs_target_listen(client, transport, addr, port=None, psk=None):
    """Start an RTRS listener; with psk (a keyring key's name, tcp only) every client must
    prove that key."""
    return client.call('rtrs_target_listen', _drop_none({
        'transport': transport, 'addr': addr, 'port': port, 'psk': psk}))


def rtrs_target_stop_listener(client, transport, addr, port=None):
    """Stop an RTRS listener."""
    return client.call('rtrs_target_stop_listener', _drop_none({
        'transport': transport, 'addr': addr, 'port': port}))


def rtrs_target_export(client, bdev_name, export_name=None, access=None, allowed_hosts=None):
    """Export a bdev over RNBD (export name defaults to the bdev name).

    allowed_hosts: list of host patterns (an address such as 127.0.0.2, a network such as
    10.0.0.0/24 or [fd00::]/64, or sess:SESSNAME); only matching hosts may open the
    export. sess:SESSNAME identifies, it does not authenticate (clients choose their
    session names): use it on a listener with a psk. Left out: every host may (an empty list: none, until hosts are added).
    """
    return client.call('rtrs_target_export', _drop_none({
        'bdev_name': bdev_name, 'export_name': export_name, 'access': access,
        'allowed_hosts': allowed_hosts}))


def rtrs_target_export_add_host(client, export_name, host):
    """Allow host pattern `host` to open export `export_name`."""
    return client.call('rtrs_target_export_add_host',
                       {'export_name': export_name, 'host': host})


def rtrs_target_export_remove_host(client, export_name, host):
    """Refuse later opens of `export_name` by `host` (devices it has open stay open)."""
    return client.call('rtrs_target_export_remove_host',
                       {'export_name': export_name, 'host': host})


def rtrs_target_get_exports(client, export_name=None):
    """Exports with their bdev, access and allowed hosts."""
    return client.call('rtrs_target_get_exports', _drop_none({'export_name': export_name}))


def rtrs_target_unexport(client, export_name):
    """Withdraw an export; devices open on it fail their IO."""
    return client.call('rtrs_target_unexport', {'export_name': export_name})


def rtrs_target_get_sessions(client):
    """RTRS target sessions with their paths, devices (mappings) and statistics."""
    return client.call('rtrs_target_get_sessions')


def rtrs_target_force_close(client, export_name, sessname):
    """Close session `sessname`'s mapping of `export_name` (the kernel's force_close): its
    IO fails, its writer slot is free, its next open is checked against the host list and
    access rules again. Returns the mappings closed."""
    return client.call('rtrs_target_force_close',
                       {'export_name': export_name, 'sessname': sessname})


def rtrs_target_disconnect(client, sessname, path=None):
    """Disconnect session `sessname`, or only its path `path` (client@server as
    rtrs_target_get_exports' openers show it, or the client's address); the client
    reconnects under its own policy. Returns how many paths close."""
    return client.call('rtrs_target_disconnect', _drop_none({'sessname': sessname, 'path': path}))


# ---- rpc.py sub-commands ---------------------------------------------------------------

def spdk_rpc_plugin_initialize(subparsers):
    def _bdev_rtrs_create(args):
        try:
            paths = [parse_path(p, args.psk) for p in args.path]
        except ValueError as e:
            raise SystemExit("bdev_rtrs_create: --path: %s" % e)
        _print_json(bdev_rtrs_create(
            args.client, name=args.name, sessname=args.sessname, paths=paths,
            device=args.device, access_mode=args.access_mode, mp_policy=args.mp_policy,
            max_reconnect_attempts=args.max_reconnect_attempts,
            reconnect_delay_sec=args.reconnect_delay_sec, hb_interval_ms=args.hb_interval_ms,
            hb_missed_max=args.hb_missed_max, io_timeout_sec=args.io_timeout_sec,
            write_zeroes=args.write_zeroes, loss_timeout_sec=args.loss_timeout_sec))

    p = subparsers.add_parser('bdev_rtrs_create',
                              help='Create an rtrs bdev: map a remote RNBD device over an RTRS session '
                                   '(a connected sessname: over that session, same paths and settings)')
    p.add_argument('-b', '--name', help='Name of the bdev', required=True)
    p.add_argument('-n', '--sessname', help='RTRS session name; bdevs of one sessname share its '
                   'session (its paths and settings must match)', required=True)
    p.add_argument('-d', '--device', help='Name of the device exported by the target', required=True)
    p.add_argument('-p', '--path', action='append', required=True,
                   help='Path as transport:[src_addr@]dst_addr[:port][,psk=NAME], e.g. '
                        'tcp:127.0.0.1:1234 (IPv6 in brackets: tcp:[::1]:1234; port defaults '
                        'to %d; psk=NAME: a key in SPDK\'s keyring authenticating this path). '
                        'Repeat for multipath.' % DEFAULT_PORT)
    p.add_argument('-k', '--psk',
                   help='Name of a key in SPDK\'s keyring (keyring_file_add_key) that '
                        'authenticates every tcp path not naming its own')
    p.add_argument('-a', '--access-mode', choices=ACCESS_MODES,
                   help='Access mode. Default: rw')
    p.add_argument('-m', '--mp-policy', choices=MP_POLICIES,
                   help='Multipath policy. Default: min-inflight')
    p.add_argument('-r', '--max-reconnect-attempts', type=int,
                   help='Reconnect attempts: -1 forever (default), 0 never, N attempts')
    p.add_argument('-D', '--reconnect-delay-sec', type=int,
                   help='Seconds before a reconnect attempt. Default: 30')
    p.add_argument('-i', '--hb-interval-ms', type=int,
                   help='Heartbeat interval in milliseconds. Default: 5000')
    p.add_argument('-M', '--hb-missed-max', type=int,
                   help='Missed heartbeats before a path is dead. Default: 5')
    p.add_argument('-t', '--io-timeout-sec', type=int,
                   help='Seconds IO waits while the device is unreachable (no path, or '
                        'not re-opened yet after a reconnect). Default: 30')
    p.add_argument('-z', '--write-zeroes', choices=WRITE_ZEROES_MODES,
                   help='How write-zeroes are sent: emulate (zero-filled writes, safe with every '
                        'target; default) or native (RNBD op 5: only for targets on Linux 6.8+ '
                        'or rtrs targets)')
    p.add_argument('-L', '--loss-timeout-sec', type=int,
                   help='Seconds the session may have no path before its bdevs fail their IO '
                        'and are unregistered (like bdev_nvme\'s ctrlr_loss_timeout_sec). '
                        'Default: -1, never')
    p.set_defaults(func=_bdev_rtrs_create)

    def _bdev_rtrs_delete(args):
        bdev_rtrs_delete(args.client, name=args.name)

    p = subparsers.add_parser('bdev_rtrs_delete', help='Delete an rtrs bdev')
    p.add_argument('name', help='Name of the rtrs bdev')
    p.set_defaults(func=_bdev_rtrs_delete)

    def _bdev_rtrs_get_sessions(args):
        _print_json(bdev_rtrs_get_sessions(args.client, name=args.name))

    p = subparsers.add_parser('bdev_rtrs_get_sessions',
                              help='Show rtrs bdev sessions: paths, states, latency, statistics')
    p.add_argument('-b', '--name', help='Only this rtrs bdev')
    p.set_defaults(func=_bdev_rtrs_get_sessions)

    def _path_args(p):
        p.add_argument('name', help='Name of the rtrs bdev')
        p.add_argument('-t', '--transport', choices=TRANSPORTS, default='tcp',
                       help='Transport. Default: tcp')
        p.add_argument('-a', '--dst-addr', required=True, help='Target address')
        p.add_argument('-s', '--port', type=int,
                       help='Target port. Default: %d' % DEFAULT_PORT)
        p.add_argument('-S', '--src-addr', help='Source address (optional)')

    def _bdev_rtrs_add_path(args):
        bdev_rtrs_add_path(args.client, name=args.name, transport=args.transport,
                           dst_addr=args.dst_addr, port=args.port, src_addr=args.src_addr,
                           psk=args.psk)

    p = subparsers.add_parser('bdev_rtrs_add_path', help='Add a path to the session of an rtrs bdev (all its devices)')
    _path_args(p)
    p.add_argument('-k', '--psk',
                   help='Name of a key in SPDK\'s keyring that authenticates the path (tcp)')
    p.set_defaults(func=_bdev_rtrs_add_path)

    def _bdev_rtrs_remove_path(args):
        bdev_rtrs_remove_path(args.client, name=args.name, transport=args.transport,
                              dst_addr=args.dst_addr, port=args.port, src_addr=args.src_addr)

    p = subparsers.add_parser('bdev_rtrs_remove_path',
                              help='Remove a path from the session of an rtrs bdev (all its devices)')
    _path_args(p)
    p.set_defaults(func=_bdev_rtrs_remove_path)

    def _bdev_rtrs_disconnect_path(args):
        bdev_rtrs_disconnect_path(args.client, name=args.name, transport=args.transport,
                                  dst_addr=args.dst_addr, port=args.port,
                                  src_addr=args.src_addr)

    p = subparsers.add_parser('bdev_rtrs_disconnect_path',
                              help='Disconnect one path of the session of an rtrs bdev now (it '
                                   'stays closed until bdev_rtrs_reconnect_path)')
    _path_args(p)
    p.set_defaults(func=_bdev_rtrs_disconnect_path)

    def _bdev_rtrs_reconnect_path(args):
        bdev_rtrs_reconnect_path(args.client, name=args.name, transport=args.transport,
                                 dst_addr=args.dst_addr, port=args.port,
                                 src_addr=args.src_addr)

    p = subparsers.add_parser('bdev_rtrs_reconnect_path',
                              help='Reconnect one path of the session of an rtrs bdev now')
    _path_args(p)
    p.set_defaults(func=_bdev_rtrs_reconnect_path)

    def _bdev_rtrs_set_session_options(args):
        bdev_rtrs_set_session_options(args.client, name=args.name,
                                      max_reconnect_attempts=args.max_reconnect_attempts,
                                      reconnect_delay_sec=args.reconnect_delay_sec,
                                      loss_timeout_sec=args.loss_timeout_sec)

    p = subparsers.add_parser('bdev_rtrs_set_session_options',
                              help='Change the reconnect attempts and delay and the loss '
                                   'timeout of the session of an rtrs bdev (all its devices)')
    p.add_argument('name', help='Name of the rtrs bdev')
    p.add_argument('-r', '--max-reconnect-attempts', type=int,
                   help='Reconnect attempts: -1 forever, 0 never, N attempts')
    p.add_argument('-D', '--reconnect-delay-sec', type=int,
                   help='Seconds before a reconnect attempt')
    p.add_argument('-L', '--loss-timeout-sec', type=int,
                   help='Seconds without a path before the bdevs fail their IO and are '
                        'unregistered; -1 never')
    p.set_defaults(func=_bdev_rtrs_set_session_options)

    def _bdev_rtrs_remap(args):
        _print_json(bdev_rtrs_remap(args.client, name=args.name))

    p = subparsers.add_parser('bdev_rtrs_remap',
                              help='OPEN the device of an rtrs bdev again: take the target\'s '
                                   'size now (the kernel\'s resize), map again a device the '
                                   'target closed (the kernel\'s remap_device)')
    p.add_argument('name', help='Name of the rtrs bdev')
    p.set_defaults(func=_bdev_rtrs_remap)

    def _bdev_rtrs_set_mp_policy(args):
        bdev_rtrs_set_mp_policy(args.client, name=args.name, mp_policy=args.mp_policy)

    p = subparsers.add_parser('bdev_rtrs_set_mp_policy',
                              help='Switch the multipath policy of the session of an rtrs bdev (all its devices)')
    p.add_argument('name', help='Name of the rtrs bdev')
    p.add_argument('mp_policy', choices=MP_POLICIES, help='New policy')
    p.set_defaults(func=_bdev_rtrs_set_mp_policy)

    def _bdev_rtrs_reset_stats(args):
        bdev_rtrs_reset_stats(args.client, name=args.name)

    p = subparsers.add_parser('bdev_rtrs_reset_stats',
                              help='Zero the statistics of the session of an rtrs bdev (all its devices)')
    p.add_argument('name', help='Name of the rtrs bdev')
    p.set_defaults(func=_bdev_rtrs_reset_stats)

    def _rtrs_target_set_options(args):
        rtrs_target_set_options(args.client, always_invalidate=args.always_invalidate,
                                queue_depth=args.queue_depth, chunk_size=args.chunk_size,
                                handshake_timeout_ms=args.handshake_timeout_ms,
                                max_pending=args.max_pending,
                                max_pending_per_source=args.max_pending_per_source,
                                max_sessions=args.max_sessions,
                                max_sessions_per_source=args.max_sessions_per_source,
                                open_grace_ms=args.open_grace_ms,
                                max_path_connections=args.max_path_connections,
                                max_connections=args.max_connections,
                                max_connections_per_source=args.max_connections_per_source)

    p = subparsers.add_parser('rtrs_target_set_options',
                              help='Set RTRS target options (before the first listener)')
    g = p.add_mutually_exclusive_group()
    g.add_argument('--always-invalidate', dest='always_invalidate', action='store_true',
                   default=None, help='New rkey per IO (default)')
    g.add_argument('--no-always-invalidate', dest='always_invalidate', action='store_false',
                   help='Keep the chunk rkeys')
    p.add_argument('-q', '--queue-depth', type=int, help='Session queue depth. Default: 512')
    p.add_argument('-c', '--chunk-size', type=int, help='Chunk size in bytes. Default: 131072')
    p.add_argument('-T', '--handshake-timeout-ms', type=int,
                   help='Close connections whose handshake is not done within this many '
                        'milliseconds. Default: 5000')
    p.add_argument('-P', '--max-pending', type=int,
                   help='Most connections still in their handshake, per listener. Default: 256')
    p.add_argument('-S', '--max-pending-per-source', type=int,
                   help='Most connections still in their handshake from one source '
                        'address. Default: 32')
    p.add_argument('-M', '--max-sessions', type=int,
                   help='Most established sessions (each holds queue_depth x chunk_size '
                        'bytes). Default: 0, as many as fit in a quarter of the memory')
    p.add_argument('-X', '--max-sessions-per-source', type=int,
                   help='Most established sessions from one source address (IPv6: /64). '
                        'Default: 16')
    p.add_argument('-G', '--open-grace-ms', type=int,
                   help='Close a session with no device open after this many milliseconds; '
                        'at a cap such sessions give way at once. Default: 10000')
    p.add_argument('-C', '--max-path-connections', type=int,
                   help='Most connections one path may ask for. Default: 513')
    p.add_argument('-N', '--max-connections', type=int,
                   help='Most connections in all. Default: 0, derived from the memory and '
                        'the file descriptors left')
    p.add_argument('-O', '--max-connections-per-source', type=int,
                   help='Most connections from one source address. Default: 0, half of '
                        'the cap in all')
    p.set_defaults(func=_rtrs_target_set_options)

    def _listen_args(p):
        p.add_argument('-t', '--transport', choices=TRANSPORTS, default='tcp',
                       help='Transport. Default: tcp')
        p.add_argument('-a', '--addr', required=True, help='Address to listen on')
        p.add_argument('-s', '--port', type=int, help='Port. Default: %d' % DEFAULT_PORT)

    def _rtrs_target_listen(args):
        rtrs_target_listen(args.client, transport=args.transport, addr=args.addr, port=args.port,
                           psk=args.psk)

    p = subparsers.add_parser('rtrs_target_listen', help='Start an RTRS listener')
    _listen_args(p)
    p.add_argument('-k', '--psk',
                   help='Name of a key in SPDK\'s keyring (keyring_file_add_key) every client '
                        'must prove (tcp). Authenticates connections; data travels in clear')
    p.set_defaults(func=_rtrs_target_listen)

    def _rtrs_target_stop_listener(args):
        rtrs_target_stop_listener(args.client, transport=args.transport, addr=args.addr,
                                  port=args.port)

    p = subparsers.add_parser('rtrs_target_stop_listener', help='Stop an RTRS listener')
    _listen_args(p)
    p.set_defaults(func=_rtrs_target_stop_listener)

    def _rtrs_target_export(args):
        rtrs_target_export(args.client, bdev_name=args.bdev_name,
                           export_name=args.export_name, access=args.access,
                           allowed_hosts=args.allowed_host)

    p = subparsers.add_parser('rtrs_target_export', help='Export a bdev over RNBD')
    p.add_argument('bdev_name', help='Name of the bdev to export')
    p.add_argument('-e', '--export-name', help='Export name. Default: the bdev name')
    p.add_argument('-a', '--access', choices=('ro', 'rw'), help='Access. Default: rw')
    p.add_argument('-H', '--allowed-host', action='append',
                   help='Only hosts matching this pattern may open the export: an address '
                        '(127.0.0.2), a network (10.0.0.0/24, [fd00::]/64) or sess:SESSNAME '
                        '(identifies, does not authenticate: use with a psk on the listener). '
                        'Repeatable. Default: every host may')
    p.set_defaults(func=_rtrs_target_export)

    def _rtrs_target_export_add_host(args):
        rtrs_target_export_add_host(args.client, export_name=args.export_name, host=args.host)

    p = subparsers.add_parser('rtrs_target_export_add_host',
                              help='Allow a host to open an export')
    p.add_argument('export_name', help='Export name')
    p.add_argument('host', help='Host pattern: address, network or sess:SESSNAME '
                                '(identifies, does not authenticate: use with a psk on the listener)')
    p.set_defaults(func=_rtrs_target_export_add_host)

    def _rtrs_target_export_remove_host(args):
        rtrs_target_export_remove_host(args.client, export_name=args.export_name,
                                       host=args.host)

    p = subparsers.add_parser('rtrs_target_export_remove_host',
                              help='Refuse later opens of an export by a host '
                                   '(devices it has open stay open)')
    p.add_argument('export_name', help='Export name')
    p.add_argument('host', help='Host pattern as it was added')
    p.set_defaults(func=_rtrs_target_export_remove_host)

    def _rtrs_target_get_exports(args):
        _print_json(rtrs_target_get_exports(args.client, export_name=args.export_name))

    p = subparsers.add_parser('rtrs_target_get_exports',
                              help='Show exports with their bdev, access, allowed hosts and '
                                   'openers (session, access mode, paths, since when)')
    p.add_argument('-e', '--export-name', help='Only this export')
    p.set_defaults(func=_rtrs_target_get_exports)

    def _rtrs_target_unexport(args):
        rtrs_target_unexport(args.client, export_name=args.export_name)

    p = subparsers.add_parser('rtrs_target_unexport', help='Withdraw an RNBD export')
    p.add_argument('export_name', help='Export name')
    p.set_defaults(func=_rtrs_target_unexport)

    def _rtrs_target_get_sessions(args):
        _print_json(rtrs_target_get_sessions(args.client))

    p = subparsers.add_parser('rtrs_target_get_sessions',
                              help='Show RTRS target sessions, paths, devices and statistics')
    p.set_defaults(func=_rtrs_target_get_sessions)

    def _rtrs_target_force_close(args):
        _print_json(rtrs_target_force_close(args.client, export_name=args.export_name,
                                            sessname=args.sessname))

    p = subparsers.add_parser('rtrs_target_force_close',
                              help='Close one session\'s mapping of an export (the kernel\'s '
                                   'force_close): its IO fails, its next open is checked again')
    p.add_argument('export_name', help='Export name')
    p.add_argument('sessname', help='Session name (rtrs_target_get_exports shows the openers)')
    p.set_defaults(func=_rtrs_target_force_close)

    def _rtrs_target_disconnect(args):
        _print_json(rtrs_target_disconnect(args.client, sessname=args.sessname, path=args.path))

    p = subparsers.add_parser('rtrs_target_disconnect',
                              help='Disconnect an RTRS session, or one of its paths')
    p.add_argument('sessname', help='Session name')
    p.add_argument('-p', '--path', help='Only this path: client@server as the openers show '
                                        'it, or the client\'s address')
    p.set_defaults(func=_rtrs_target_disconnect)
