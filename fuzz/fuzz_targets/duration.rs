//! Durations from the CRD spec, flags and DynamoDB items (Go syntax).
#![no_main]
use libfuzzer_sys::fuzz_target;
use lockwarden::duration::{format_duration, parse_duration, parse_positive_duration};

fuzz_target!(|text: &str| {
    let parsed = parse_duration(text);
    if let Ok(d) = parsed {
        // Whatever is accepted formats back to a string that reads as the same duration.
        let formatted = format_duration(d);
        assert_eq!(
            parse_duration(&formatted),
            Ok(d),
            "{text:?} -> {formatted:?}"
        );
    }
    match parse_positive_duration(text) {
        Ok(d) => assert_eq!(parsed, Ok(d)),
        Err(e) => assert!(
            parsed.is_err() || parsed == Ok(std::time::Duration::ZERO),
            "{e}"
        ),
    }
});
