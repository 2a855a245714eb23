//! Lock files `unlock` reads (written by `lock`, or by s3lock, or edited by hand).
#![no_main]
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use lockwarden::backend::Target;
use lockwarden::cli::lockfile::LockFile;

fuzz_target!(|bytes: &[u8]| {
    let path = Path::new("fuzz.lock");
    if let Ok(file) = LockFile::parse(path, bytes) {
        // Checked files give a target and survive being written and read again.
        let target = file.target();
        assert_eq!(target.url(), Target::parse(&file.url).unwrap().url());
        let _ = file.acquired();
        let again = serde_json::to_vec_pretty(&file).unwrap();
        assert_eq!(LockFile::parse(path, &again).unwrap(), file);
    }
});
