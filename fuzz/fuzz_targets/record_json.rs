//! The JSON lock record stored as an S3 object body (and in ZooKeeper znodes).
#![no_main]
use libfuzzer_sys::fuzz_target;
use lockwarden::lock::LockRecord;

fuzz_target!(|body: &[u8]| {
    match LockRecord::from_json(body) {
        Ok(record) => {
            assert!(!record.nonce.is_empty() && !record.lease.is_zero());
            let back = LockRecord::from_json(&record.to_json()).expect("own encoding reads back");
            assert_eq!(back, record);
        }
        Err(foreign) => {
            // The description goes into errors, logs and status messages: bounded.
            assert!(foreign.what.len() <= 1024, "{} bytes", foreign.what.len());
        }
    }
});
