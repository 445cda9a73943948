//! The exports' host lists over RPC, NVMe-oF's subsystem host list as the model
//! (`nvmf_create_subsystem` + `nvmf_subsystem_add_host` / `nvmf_subsystem_remove_host`):
//! `rtrs_target_export`'s `allowed_hosts`, `rtrs_target_export_add_host`,
//! `rtrs_target_export_remove_host` and `rtrs_target_get_exports`. The list lives in the
//! shared [`Exports`](rtrs_spdk::rnbd::server::Exports) and is checked by every OPEN
//! (`rtrs_spdk::rnbd::server::HostList`): an export created without `allowed_hosts` is
//! open to every host; with it (even empty) only to the hosts it matches. Removing a host
//! leaves the devices it has open working; its next OPEN is refused with −EACCES.

use rtrs_spdk::rnbd::server::{HostList, HostPattern, Opener};
use serde_json::{json, Value};

use super::SpdkTarget;

/// Parses `allowed_hosts` (an array of pattern strings) for `method`; errors name the
/// entry (`'allowed_hosts[1]'`).
///
/// # Errors
/// Not an array of strings, a bad pattern, or one given twice.
pub fn parse_allowed(method: &str, v: &Value) -> Result<Vec<HostPattern>, String> {
    let Value::Array(items) = v else {
        return Err(format!(
            "{method}: 'allowed_hosts' must be an array of host patterns, got {v}"
        ));
    };
    let mut out: Vec<HostPattern> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Value::String(s) = item else {
            return Err(format!(
                "{method}: 'allowed_hosts[{i}]' must be a string, got {item}"
            ));
        };
        let p = parse_host(method, &format!("allowed_hosts[{i}]"), s)?;
        if out.contains(&p) {
            return Err(format!(
                "{method}: 'allowed_hosts[{i}]' = {s:?} is given twice"
            ));
        }
        out.push(p);
    }
    Ok(out)
}

/// One pattern of field `field`.
///
/// # Errors
/// A message naming the field and the pattern.
pub fn parse_host(method: &str, field: &str, s: &str) -> Result<HostPattern, String> {
    s.parse::<HostPattern>()
        .map_err(|e| format!("{method}: '{field}': {e}"))
}

/// The text of a list, for JSON.
fn texts(list: &[HostPattern]) -> Vec<String> {
    list.iter().map(ToString::to_string).collect()
}

/// A new export's list: `None` (no `allowed_hosts`) is open to every host.
pub fn initial(list: Option<Vec<HostPattern>>) -> HostList {
    match list {
        None => HostList::any(),
        Some(l) => HostList::only(l),
    }
}

impl SpdkTarget {
    fn host_list(&self, method: &str, export_name: &str) -> Result<&HostList, String> {
        self.exports
            .lookup(export_name.as_bytes())
            .filter(|_| {
                self.export_list
                    .iter()
                    .any(|e| e.export_name == export_name)
            })
            .map(|id| self.exports.hosts(id))
            .ok_or_else(|| format!("{method}: 'export_name' = {export_name:?}: no such export"))
    }

    /// `rtrs_target_export_add_host`.
    ///
    /// # Errors
    /// No such export, or the host is in its list already.
    pub fn add_host(&self, export_name: &str, host: HostPattern) -> Result<(), String> {
        const M: &str = "rtrs_target_export_add_host";
        let text = host.to_string();
        if !self.host_list(M, export_name)?.add(host) {
            return Err(format!(
                "{M}: 'host' = {text:?} is already in export '{export_name}''s allowed hosts"
            ));
        }
        tracing::info!("rtrs target: export '{export_name}': host {text} allowed");
        Ok(())
    }

    /// `rtrs_target_export_remove_host`: later OPENs from the host are refused; what it
    /// has open stays open.
    ///
    /// # Errors
    /// No such export, or the host is not in its list.
    pub fn remove_host(&self, export_name: &str, host: &HostPattern) -> Result<(), String> {
        const M: &str = "rtrs_target_export_remove_host";
        if !self.host_list(M, export_name)?.remove(host) {
            return Err(format!(
                "{M}: 'host' = \"{host}\" is not in export '{export_name}''s allowed hosts"
            ));
        }
        tracing::info!("rtrs target: export '{export_name}': host {host} no longer allowed");
        Ok(())
    }

    /// The `allowed_hosts` parameter of export `name` for `save_config` (`None`: open to
    /// every host, the parameter is left out).
    pub fn allowed_hosts_json(&self, name: &str) -> Option<Value> {
        let id = self.exports.lookup(name.as_bytes())?;
        self.exports.hosts(id).get().map(|l| json!(texts(&l)))
    }

    /// `rtrs_target_get_exports`: every export (or the one named) with its bdev, access,
    /// host list and openers (session, access mode, device id, paths, since when).
    ///
    /// # Errors
    /// `export_name` names no export.
    pub fn get_exports(&self, only: Option<&str>) -> Result<Value, String> {
        if let Some(name) = only {
            self.host_list("rtrs_target_get_exports", name)?;
        }
        let openers = self.control().openers(None).unwrap_or_default();
        let out = self
            .export_list
            .iter()
            .filter(|e| only.map_or(true, |n| n == e.export_name))
            .map(|e| {
                let list = self
                    .exports
                    .lookup(e.export_name.as_bytes())
                    .and_then(|id| self.exports.hosts(id).get());
                let mine: Vec<&Opener> = openers
                    .iter()
                    .filter(|o| o.export == e.export_name)
                    .collect();
                json!({
                    "export_name": e.export_name,
                    "bdev_name": e.bdev_name,
                    "access": e.access.as_str(),
                    "allow_any_host": list.is_none(),
                    "allowed_hosts": texts(list.as_deref().unwrap_or(&[])),
                    "openers": mine,
                })
            })
            .collect();
        Ok(Value::Array(out))
    }
}
