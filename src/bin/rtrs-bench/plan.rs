//! How a run is laid out on the device: the region used and, per reactor, its slice
//! (contiguous, whole blocks) and queue depth, checked against the mapped device.

use rtrs_spdk::rnbd::client::DeviceInfo;

use crate::worker::JobPlan;
use crate::{usage, Failure};

/// Checks the run against the device and splits it: the region used, and per reactor
/// its slice (contiguous, whole blocks) and queue depth; reactors beyond `qd` get none.
pub fn plan(
    info: &DeviceInfo,
    device: &str,
    bs: u32,
    size: Option<u64>,
    qd: usize,
    cores: usize,
) -> Result<(u64, Vec<Option<JobPlan>>), Failure> {
    if bs % info.logical_block_size != 0 {
        return Err(usage(format!(
            "--bs {bs} is not a multiple of device '{device}''s {}-byte logical block",
            info.logical_block_size
        )));
    }
    if bs > info.max_io_size {
        return Err(usage(format!(
            "--bs {bs} exceeds the largest IO of device '{device}' over this session, {} bytes \
             (the target's chunk size minus 4 KiB: start it with a larger --chunk-size)",
            info.max_io_size
        )));
    }
    let bs = u64::from(bs);
    let region = size.unwrap_or(info.size / bs * bs);
    if region > info.size {
        return Err(usage(format!(
            "--size {region} is larger than device '{device}' ({} bytes)",
            info.size
        )));
    }
    let active = cores.min(qd);
    let units = region / bs;
    if units < active as u64 {
        return Err(usage(format!(
            "device '{device}' ({} bytes) holds fewer than {active} blocks of --bs {bs}, \
             one per reactor",
            info.size
        )));
    }
    let a = active as u64;
    let plans = (0..cores)
        .map(|k| {
            let k64 = k as u64;
            (k < active).then(|| JobPlan {
                start: k64 * units / a * bs,
                units: (k64 + 1) * units / a - k64 * units / a,
                qd: qd / active + usize::from(k < qd % active),
            })
        })
        .collect();
    Ok((region, plans))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(size: u64, lbs: u32, max_io: u32) -> DeviceInfo {
        DeviceInfo {
            device_id: 0,
            size,
            logical_block_size: lbs,
            physical_block_size: lbs,
            max_io_size: max_io,
            max_discard: 0,
            discard_granularity: 0,
            discard_alignment: 0,
            max_write_zeroes: 0,
            server_max_write_zeroes: 0,
            max_secure_erase: 0,
            write_cache: false,
            fua: false,
            io_boundary: 0,
        }
    }

    #[test]
    fn plans_split_the_region_and_the_queue_depth() {
        let d = dev(1 << 20, 512, 126_976);
        let (region, p) = plan(&d, "v", 4096, None, 5, 2).unwrap();
        assert_eq!(region, 1 << 20);
        let p: Vec<JobPlan> = p.into_iter().flatten().collect();
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].start, p[0].units, p[0].qd), (0, 128, 3));
        assert_eq!((p[1].start, p[1].units, p[1].qd), (128 * 4096, 128, 2));
        // QD 1 on two reactors: one works, on the whole region.
        let (_, p) = plan(&d, "v", 4096, Some(64 << 10), 1, 2).unwrap();
        assert!(p[1].is_none());
        assert_eq!(p[0].map(|p| (p.units, p.qd)), Some((16, 1)));
        for (bs, size, words) in [
            (131_072, None, "largest IO"),
            (4096, Some(2 << 20), "larger"),
            (2048, None, "logical block"),
        ] {
            let d = dev(1 << 20, 4096, 126_976);
            let e = plan(&d, "v", bs, size, 1, 1).unwrap_err();
            assert!(e.0.contains(words), "{}", e.0);
        }
        let e = plan(&dev(4096, 512, 126_976), "v", 4096, None, 2, 2).unwrap_err();
        assert!(e.0.contains("fewer than 2 blocks"), "{}", e.0);
    }
}
