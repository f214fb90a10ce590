//! Memory budgets: sizes as users write them, the memory available to this process
//! (`MemAvailable` and the cgroup limit), and the check a pin must pass before anything is
//! locked — locked pages count against the cgroup and cannot be reclaimed, so an oversize pin
//! would invite the OOM killer.

use anyhow::{Result, bail};

/// [`parse_size`] where `all` is not a size (`--cache-size`, budgets). Errors: as
/// [`parse_size`], or `all`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    parse_size(s)?.ok_or_else(|| "give a size such as 2G".to_string())
}

/// Memory left free when checking a pin or warm budget, bytes.
pub const MEMORY_MARGIN: u64 = 512 << 20;

/// Parses a size: plain bytes or with a K/M/G/T suffix (powers of 1024; `2GB` and `2GiB`
/// read as `2G`), e.g. `512M`, `2G`. `all` gives `None`.
pub fn parse_size(s: &str) -> Result<Option<u64>, String> {
    let mut t = s.trim();
    if t.eq_ignore_ascii_case("all") {
        return Ok(None);
    }
    for unit in ["ib", "b"] {
        let n = t.len();
        if n > unit.len() + 1
            && t[n - unit.len()..].eq_ignore_ascii_case(unit)
            && t.as_bytes()[n - unit.len() - 1].is_ascii_alphabetic()
        {
            t = &t[..n - unit.len()];
            break;
        }
    }
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => {
                    return Err(format!(
                        "unknown size suffix in {s:?} (use K, M, G, T or all)"
                    ));
                }
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("not a size: {s:?}"))?;
    if v.is_nan() || v < 0.0 {
        return Err(format!("not a size: {s:?}"));
    }
    Ok(Some((v * mult as f64) as u64))
}

/// `MemAvailable` from /proc/meminfo, bytes.
pub fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// Room left under this process's cgroup memory limit, bytes, with the limit file's path;
/// `None` when unlimited or unknown. Reads cgroup v2 (`memory.max − memory.current`, under
/// `/sys/fs/cgroup` or `/sys/fs/cgroup/unified`) and v1 (`memory.limit_in_bytes −
/// memory.usage_in_bytes` under `/sys/fs/cgroup/memory`).
pub fn cgroup_room() -> Option<(u64, String)> {
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |p: &str| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let mut best: Option<(u64, String)> = None;
    for line in cg.lines() {
        let mut f = line.splitn(3, ':');
        let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
        let candidates: Vec<(String, String)> = if ctrl.is_empty() {
            ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
                .iter()
                .map(|root| {
                    (
                        format!("{root}{path}/memory.max"),
                        format!("{root}{path}/memory.current"),
                    )
                })
                .collect()
        } else if ctrl.split(',').any(|c| c == "memory") {
            let d = format!("/sys/fs/cgroup/memory{path}");
            vec![(
                format!("{d}/memory.limit_in_bytes"),
                format!("{d}/memory.usage_in_bytes"),
            )]
        } else {
            continue;
        };
        for (max_p, cur_p) in candidates {
            // "max" (v2) fails to parse; v1 reports ~2^63 for unlimited.
            let (Some(max), Some(cur)) = (read(&max_p), read(&cur_p)) else {
                continue;
            };
            if max >= 1 << 62 {
                continue;
            }
            let room = max.saturating_sub(cur);
            if best.as_ref().is_none_or(|(r, _)| room < *r) {
                best = Some((room, max_p));
            }
        }
    }
    best
}

/// Checks that `bytes` can be pinned: it must fit in `MemAvailable` and under the cgroup limit,
/// with [`MEMORY_MARGIN`] to spare. The error says which limit and by how much.
pub fn check_pin_budget(bytes: u64) -> Result<()> {
    match pin_refusal(bytes, mem_available(), cgroup_room()) {
        Some(why) => bail!("{why}"),
        None => Ok(()),
    }
}

/// Why pinning `bytes` is refused given `avail` (MemAvailable, bytes) and the room left by
/// a memory cgroup limit (bytes, and the limit's file), or `None` if it fits with
/// [`MEMORY_MARGIN`] to spare in both.
fn pin_refusal(bytes: u64, avail: Option<u64>, cgroup: Option<(u64, String)>) -> Option<String> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    if let Some(avail) = avail
        && bytes + MEMORY_MARGIN > avail
    {
        return Some(format!(
            "cannot pin {:.2} GiB: only {:.2} GiB of memory is available (MemAvailable) and {:.2} GiB must stay free; \
             pin less (--pin SIZE) or free memory",
            gib(bytes),
            gib(avail),
            gib(MEMORY_MARGIN)
        ));
    }
    if let Some((room, limit_file)) = cgroup
        && bytes + MEMORY_MARGIN > room
    {
        return Some(format!(
            "cannot pin {:.2} GiB: the cgroup limit {limit_file} leaves {:.2} GiB and {:.2} GiB must stay free \
             (locked pages count against it and cannot be reclaimed); pin less or raise memory.max",
            gib(bytes),
            gib(room),
            gib(MEMORY_MARGIN)
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_over_mem_available_or_the_cgroup_room_are_refused() {
        let gib = 1u64 << 30;
        // Over MemAvailable less the margin: refused, naming MemAvailable.
        let why = pin_refusal(4 * gib, Some(4 * gib), None).unwrap();
        assert!(why.contains("MemAvailable"), "{why}");
        assert!(pin_refusal(4 * gib - MEMORY_MARGIN + 1, Some(4 * gib), None).is_some());
        // Exactly the margin to spare: accepted.
        assert!(pin_refusal(4 * gib - MEMORY_MARGIN, Some(4 * gib), None).is_none());
        // Fits in memory but not in the cgroup: refused, naming the limit file.
        let cg = Some((gib, "/sys/fs/cgroup/x/memory.max".to_string()));
        let why = pin_refusal(gib, Some(64 * gib), cg.clone()).unwrap();
        assert!(why.contains("memory.max"), "{why}");
        assert!(pin_refusal(gib - MEMORY_MARGIN, Some(64 * gib), cg).is_none());
        // Nothing known: accepted.
        assert!(pin_refusal(64 * gib, None, None).is_none());
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("all"), Ok(None));
        assert_eq!(parse_size("4096"), Ok(Some(4096)));
        assert_eq!(parse_size("512M"), Ok(Some(512 << 20)));
        assert_eq!(parse_size("2g"), Ok(Some(2 << 30)));
        assert_eq!(parse_size("1.5K"), Ok(Some(1536)));
        assert_eq!(parse_size("2GB"), Ok(Some(2 << 30)));
        assert_eq!(parse_size("2GiB"), Ok(Some(2 << 30)));
        assert_eq!(parse_size("64mb"), Ok(Some(64 << 20)));
        assert!(parse_size("2B").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1G").is_err());
    }

    #[test]
    fn memory_readings_are_sane() {
        let avail = mem_available().expect("MemAvailable on Linux");
        assert!(avail > 0);
        assert!(check_pin_budget(u64::MAX / 4).is_err());
        assert!(check_pin_budget(1 << 20).is_ok());
    }
}
