//! Timestamps as text: RFC 3339 with nanoseconds for output, RFC 3339 or epoch seconds for input.

use std::fmt;

/// A time string that could not be understood.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error(
    "cannot read time {input:?}: {why}; expected RFC 3339 (2024-05-01T12:00:00Z, 2024-05-01T12:00:00.5+02:00) or epoch seconds (1714564800.25)"
)]
pub struct TimeParseError {
    /// The text given.
    pub input: String,
    /// What was wrong.
    pub why: &'static str,
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Formats nanoseconds since the epoch as RFC 3339 UTC with nine fractional digits.
#[derive(Clone, Copy, Debug)]
pub struct Rfc3339(pub u64);

impl fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = (self.0 / 1_000_000_000) as i64;
        let ns = self.0 % 1_000_000_000;
        let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
        let s = secs.rem_euclid(86_400);
        write!(f, "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ns:09}Z", s / 3600, s / 60 % 60, s % 60)
    }
}

fn digits(s: &str, input: &str, why: &'static str) -> Result<u64, TimeParseError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || s.len() > 19 {
        return Err(TimeParseError { input: input.to_string(), why });
    }
    Ok(s.parse().expect("validated digits"))
}

/// Fractional seconds (".123") to nanoseconds, truncating beyond nine digits.
fn fraction(s: &str, input: &str) -> Result<u64, TimeParseError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TimeParseError { input: input.to_string(), why: "bad fractional seconds" });
    }
    let mut ns = 0u64;
    for (i, b) in s.bytes().take(9).enumerate() {
        ns += u64::from(b - b'0') * 10u64.pow(8 - i as u32);
    }
    Ok(ns)
}

/// Parses RFC 3339 (`T` or a space between date and time; `Z` or an offset) or epoch seconds with an optional
/// fraction, into nanoseconds since the epoch.
pub fn parse_time(input: &str) -> Result<u64, TimeParseError> {
    let t = input.trim();
    let err = |why| TimeParseError { input: input.to_string(), why };
    if !t.contains('-') && !t.contains(':') {
        let (int, frac) = t.split_once('.').unwrap_or((t, ""));
        let secs = digits(int, input, "epoch seconds must be digits")?;
        let ns = if frac.is_empty() { 0 } else { fraction(frac, input)? };
        return secs.checked_mul(1_000_000_000).and_then(|v| v.checked_add(ns)).ok_or_else(|| err("time out of range"));
    }
    let b = t.as_bytes();
    if b.len() < 19
        || !b[..19].is_ascii()
        || b[4] != b'-'
        || b[7] != b'-'
        || !(b[10] == b'T' || b[10] == b't' || b[10] == b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(err("not of the form YYYY-MM-DDTHH:MM:SS"));
    }
    let y = digits(&t[0..4], input, "bad year")? as i64;
    let mo = digits(&t[5..7], input, "bad month")? as u32;
    let d = digits(&t[8..10], input, "bad day")? as u32;
    let h = digits(&t[11..13], input, "bad hour")?;
    let mi = digits(&t[14..16], input, "bad minute")?;
    let s = digits(&t[17..19], input, "bad second")?;
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return Err(err("a field is out of range"));
    }
    let mut rest = &t[19..];
    let mut ns = 0;
    if let Some(r) = rest.strip_prefix('.') {
        let end = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
        ns = fraction(&r[..end], input)?;
        rest = &r[end..];
    }
    let offset_s: i64 = match rest {
        "Z" | "z" | "" => 0,
        _ => {
            let sign = match rest.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return Err(err("bad time zone; use Z or +HH:MM")),
            };
            let z = &rest[1..];
            if z.len() != 5 || z.as_bytes()[2] != b':' {
                return Err(err("bad time zone; use Z or +HH:MM"));
            }
            let zh = digits(&z[0..2], input, "bad time zone hour")? as i64;
            let zm = digits(&z[3..5], input, "bad time zone minute")? as i64;
            sign * (zh * 3600 + zm * 60)
        }
    };
    let days = days_from_civil(y, mo, d);
    let secs = days * 86_400 + (h * 3600 + mi * 60 + s) as i64 - offset_s;
    if secs < 0 {
        return Err(err("time before 1970"));
    }
    (secs as u64).checked_mul(1_000_000_000).and_then(|v| v.checked_add(ns)).ok_or_else(|| err("time out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_values() {
        assert_eq!(parse_time("1970-01-01T00:00:00Z").unwrap(), 0);
        assert_eq!(parse_time("2024-05-01T12:00:00.5+02:00").unwrap(), 1_714_557_600_500_000_000);
        assert_eq!(parse_time("1714557600.5").unwrap(), 1_714_557_600_500_000_000);
        assert_eq!(Rfc3339(1_714_557_600_500_000_000).to_string(), "2024-05-01T10:00:00.500000000Z");
        assert!(parse_time("yesterday").is_err());
        assert!(parse_time("2024-13-01T00:00:00Z").is_err());
        assert!(parse_time("1.2.3").is_err());
        // A character of several bytes across the fixed positions (found by the serve_request fuzz target).
        assert!(parse_time("2024-01-01T00:00:0\u{15f}Z00 ").is_err());
        assert!(parse_time("2024-01-01T00:00:\u{e9}0").is_err());
    }

    proptest! {
        #[test]
        fn format_then_parse_round_trips(ns in 0u64..4_000_000_000_000_000_000) {
            prop_assert_eq!(parse_time(&Rfc3339(ns).to_string()).unwrap(), ns);
        }
        #[test]
        fn parse_never_panics(s in "\\PC{0,40}") {
            let _ = parse_time(&s);
        }
    }
}
