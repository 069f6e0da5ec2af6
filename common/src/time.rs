//! Time partitions and durations.
//!
//! A partition of a table with interval `w` covers `[k*w, (k+1)*w)` in
//! nanoseconds since the epoch, for an integer `k` (negative before 1970).

use crate::{Error, Result};

pub const NANOS_PER_SECOND: i64 = 1_000_000_000;
pub const NANOS_PER_DAY: i64 = 86_400 * NANOS_PER_SECOND;

/// Default width of a time partition: one day.
pub const DEFAULT_PARTITION_INTERVAL_NS: i64 = NANOS_PER_DAY;

/// Start of the partition that holds `t_ns`: the largest multiple of
/// `interval_ns` not after `t_ns`. `None` when that start is not
/// representable (times in the first partial interval after `i64::MIN`):
/// such rows are refused as out of range.
pub fn partition_start(t_ns: i64, interval_ns: i64) -> Option<i64> {
    debug_assert!(interval_ns > 0, "partition interval must be positive");
    t_ns.div_euclid(interval_ns).checked_mul(interval_ns)
}

/// End (exclusive) of a partition that starts at `start_ns`; saturates at
/// `i64::MAX` for the last partition representable.
pub fn partition_end(start_ns: i64, interval_ns: i64) -> i64 {
    start_ns.saturating_add(interval_ns)
}

/// Parses a duration such as `1d`, `12h`, `30m`, `90s`, `500ms`, `1 day`,
/// `2 hours` or `7 days` into nanoseconds. The number must be a positive
/// integer.
pub fn parse_duration_ns(text: &str) -> Result<i64> {
    let s = text.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: i64 = num.parse().map_err(|_| {
        Error::Invalid(format!(
            "invalid duration '{text}': expected e.g. '1d', '6h', '30m'"
        ))
    })?;
    if n <= 0 {
        return Err(Error::Invalid(format!(
            "duration '{text}' must be positive"
        )));
    }
    let unit_ns: i64 = match unit.trim().to_ascii_lowercase().as_str() {
        "ns" | "nanosecond" | "nanoseconds" => 1,
        "us" | "microsecond" | "microseconds" => 1_000,
        "ms" | "millisecond" | "milliseconds" => 1_000_000,
        "s" | "sec" | "second" | "seconds" => NANOS_PER_SECOND,
        "m" | "min" | "minute" | "minutes" => 60 * NANOS_PER_SECOND,
        "h" | "hour" | "hours" => 3_600 * NANOS_PER_SECOND,
        "d" | "day" | "days" => NANOS_PER_DAY,
        "w" | "week" | "weeks" => 7 * NANOS_PER_DAY,
        other => {
            return Err(Error::Invalid(format!(
                "invalid duration unit '{other}' in '{text}': use ns, us, ms, s, m, h, d or w"
            )));
        }
    };
    n.checked_mul(unit_ns)
        .ok_or_else(|| Error::Invalid(format!("duration '{text}' is too long")))
}

/// Milliseconds since the epoch, from the system clock.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn durations_parse_in_every_unit() {
        assert_eq!(parse_duration_ns("1d").unwrap(), NANOS_PER_DAY);
        assert_eq!(
            parse_duration_ns("2 hours").unwrap(),
            7_200 * NANOS_PER_SECOND
        );
        assert_eq!(parse_duration_ns("500ms").unwrap(), 500_000_000);
        assert_eq!(parse_duration_ns("1w").unwrap(), 7 * NANOS_PER_DAY);
        assert!(parse_duration_ns("0d").is_err());
        assert!(parse_duration_ns("d").is_err());
        assert!(parse_duration_ns("3 fortnights").is_err());
        assert!(parse_duration_ns("999999999999999w").is_err());
    }

    #[test]
    fn partition_start_floors_negative_times() {
        assert_eq!(partition_start(-1, 10), Some(-10));
        assert_eq!(partition_start(0, 10), Some(0));
        assert_eq!(partition_start(19, 10), Some(10));
        assert_eq!(partition_start(i64::MIN, NANOS_PER_DAY), None);
    }

    proptest! {
        #[test]
        fn every_time_falls_in_its_partition(t in any::<i64>(), w in 1i64..=NANOS_PER_DAY * 30) {
            let Some(start) = partition_start(t, w) else {
                // Only the first partial interval after i64::MIN is unrepresentable.
                prop_assert!(t.div_euclid(w) == i64::MIN.div_euclid(w));
                return Ok(());
            };
            prop_assert!(start <= t);
            prop_assert!(t < partition_end(start, w) || partition_end(start, w) == i64::MAX);
            prop_assert_eq!(start.rem_euclid(w), 0);
        }
    }
}
