//! A `coordination.k8s.io/v1` Lease body as the API server returns it, read as a
//! lock record (client-go's Leases, lockwarden's, and anything else).
#![no_main]
use k8s_openapi::api::coordination::v1::Lease;
use libfuzzer_sys::fuzz_target;
use lockwarden::backend::kubernetes::parse_lease;

fuzz_target!(|body: &[u8]| {
    let Ok(lease) = serde_json::from_slice::<Lease>(body) else {
        return;
    };
    match parse_lease(&lease) {
        Ok(record) => assert!(!record.lease.is_zero()),
        Err(foreign) => assert!(foreign.what.len() <= 1024, "{} bytes", foreign.what.len()),
    }
});
