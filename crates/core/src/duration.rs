//! Durations in Go / Kubernetes form (`"30s"`, `"1m30s"`, `"500ms"`, `"1.5h"`), as
//! `time.ParseDuration` reads them and `time.Duration.String` writes them.
//!
//! The spec keeps durations as strings (so a malformed one is rejected at admission
//! with a message rather than breaking deserialization of the whole object); these
//! functions turn them into [`std::time::Duration`] and back.

use std::time::Duration;

/// Why a duration string could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration")]
    Empty,
    #[error("malformed duration (expected e.g. \"30s\", \"1m30s\" or \"500ms\")")]
    Malformed,
    #[error("missing unit (one of ns, us, µs, ms, s, m, h)")]
    MissingUnit,
    #[error("unknown unit {0:?} (one of ns, us, µs, ms, s, m, h)")]
    UnknownUnit(String),
    #[error("duration out of range")]
    Overflow,
    #[error("duration must not be negative")]
    Negative,
    #[error("duration must be greater than zero")]
    NotPositive,
}

/// A duration given on the command line that is refused; the message names the value
/// and the expected form.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FlagDurationError {
    #[error("{text:?} is not a duration ({source}): expected e.g. 30s, 5m, 1h30m")]
    NotADuration {
        text: String,
        #[source]
        source: DurationError,
    },
    #[error("{text:?}: the duration must be greater than zero")]
    Zero { text: String },
}

/// The largest duration Go can represent (`math.MaxInt64` nanoseconds, ~292 years).
const MAX_NANOS: u128 = i64::MAX as u128;

/// A positive duration given on the command line, in Go's form: `30s`, `5m`,
/// `1h30m`, `1500ms`, `1.5h`. The error names the value and the expected form.
pub fn parse_flag_duration(s: &str) -> Result<Duration, FlagDurationError> {
    let d = parse_duration(s.trim()).map_err(|source| FlagDurationError::NotADuration {
        text: s.to_string(),
        source,
    })?;
    if d.is_zero() {
        return Err(FlagDurationError::Zero {
            text: s.to_string(),
        });
    }
    Ok(d)
}

/// Parses Go's duration syntax exactly as `time.ParseDuration` does (integer
/// arithmetic, fractions truncated to nanoseconds), except that the result must not be
/// negative: `"-1s"` is [`DurationError::Negative`] (`"-0s"` is zero).
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let mut rest = text;
    if rest.is_empty() {
        return Err(DurationError::Empty);
    }
    let negative = rest.starts_with('-');
    if let Some(r) = rest.strip_prefix('-').or_else(|| rest.strip_prefix('+')) {
        rest = r;
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(DurationError::Malformed);
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let int_part = &rest[..int_len];
        rest = &rest[int_len..];
        let mut frac_part = "";
        if let Some(r) = rest.strip_prefix('.') {
            let frac_len = r.bytes().take_while(u8::is_ascii_digit).count();
            frac_part = &r[..frac_len];
            rest = &r[frac_len..];
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(DurationError::Malformed);
        }
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let scale: u128 = match unit {
            "" => return Err(DurationError::MissingUnit),
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            other => return Err(DurationError::UnknownUnit(other.to_string())),
        };
        let whole: u128 = if int_part.is_empty() {
            0
        } else {
            // More than 39 digits cannot fit a u128, let alone the i64 range.
            int_part.parse().map_err(|_| DurationError::Overflow)?
        };
        let mut value = whole.checked_mul(scale).ok_or(DurationError::Overflow)?;
        if !frac_part.is_empty() {
            // Digits beyond nanosecond precision of the largest unit cannot matter.
            let digits = &frac_part[..frac_part.len().min(19)];
            let numerator: u128 = digits.parse().map_err(|_| DurationError::Malformed)?;
            value += numerator * scale / 10u128.pow(digits.len() as u32);
        }
        total = total.checked_add(value).ok_or(DurationError::Overflow)?;
        if total > MAX_NANOS {
            return Err(DurationError::Overflow);
        }
    }
    if negative && total > 0 {
        return Err(DurationError::Negative);
    }
    Ok(Duration::from_nanos(total as u64))
}

/// Like [`parse_duration`], but zero is an error too ([`DurationError::NotPositive`]).
pub fn parse_positive_duration(text: &str) -> Result<Duration, DurationError> {
    match parse_duration(text)? {
        d if d.is_zero() => Err(DurationError::NotPositive),
        d => Ok(d),
    }
}

/// Formats a duration as Go's `time.Duration.String` does: `"1h2m3.5s"`, `"1m30s"`,
/// `"500ms"`, `"1.5µs"`, `"0s"`. Durations beyond Go's range are clamped to it.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos().min(MAX_NANOS) as u64;
    if nanos == 0 {
        return "0s".to_string();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", fraction(nanos, 1_000));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", fraction(nanos, 1_000_000));
    }
    let hours = nanos / 3_600_000_000_000;
    let minutes = nanos / 60_000_000_000 % 60;
    let seconds = fraction(nanos % 60_000_000_000, 1_000_000_000);
    if hours > 0 {
        format!("{hours}h{minutes}m{seconds}s")
    } else if minutes > 0 {
        format!("{minutes}m{seconds}s")
    } else {
        format!("{seconds}s")
    }
}

/// `value / div` with the remainder as decimal digits, trailing zeros dropped.
fn fraction(value: u64, div: u64) -> String {
    let (whole, rest) = (value / div, value % div);
    if rest == 0 {
        return whole.to_string();
    }
    let width = div.to_string().len() - 1;
    let digits = format!("{rest:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn parses_go_forms() {
        let cases = [
            ("30s", Duration::from_secs(30)),
            ("1m30s", Duration::from_secs(90)),
            ("500ms", ms(500)),
            ("1.5h", Duration::from_secs(5400)),
            ("1h2m3.5s", ms(3_723_500)),
            (".5s", ms(500)),
            ("1.s", Duration::from_secs(1)),
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("-0s", Duration::ZERO),
            ("+5s", Duration::from_secs(5)),
            ("10us", Duration::from_micros(10)),
            ("10µs", Duration::from_micros(10)),
            ("10μs", Duration::from_micros(10)),
            ("7ns", Duration::from_nanos(7)),
            ("1.0000000001s", Duration::from_secs(1)),
            ("2562047h", Duration::from_secs(2_562_047 * 3600)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Ok(want), "{text:?}");
        }
    }

    #[test]
    fn rejects_bad_forms() {
        let cases = [
            ("", DurationError::Empty),
            ("-", DurationError::Malformed),
            ("30", DurationError::MissingUnit),
            ("1m30", DurationError::MissingUnit),
            ("s", DurationError::Malformed),
            (".s", DurationError::Malformed),
            ("30 s", DurationError::UnknownUnit(" s".into())),
            ("3d", DurationError::UnknownUnit("d".into())),
            ("-1s", DurationError::Negative),
            ("2562048h", DurationError::Overflow),
            (
                "99999999999999999999999999999999999999999h",
                DurationError::Overflow,
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Err(want), "{text:?}");
        }
        assert_eq!(
            parse_positive_duration("0s"),
            Err(DurationError::NotPositive)
        );
    }

    #[test]
    fn formats_like_go() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(7), "7ns"),
            (Duration::from_nanos(1_500), "1.5µs"),
            (ms(500), "500ms"),
            (Duration::from_secs(30), "30s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (ms(3_723_500), "1h2m3.5s"),
        ];
        for (d, want) in cases {
            assert_eq!(format_duration(d), want);
            assert_eq!(parse_duration(want), Ok(d), "round trip of {want}");
        }
    }
}
