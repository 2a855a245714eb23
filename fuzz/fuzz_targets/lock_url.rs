//! Lock URLs from the command line, lock files and the CRD.
#![no_main]
use libfuzzer_sys::fuzz_target;
use lockwarden::backend::Target;
use lockwarden::backend::zookeeper::parse_connect;

fuzz_target!(|url: &str| {
    match Target::parse(url) {
        Ok(target) => {
            // The canonical form parses back to the same target.
            let canonical = target.to_string();
            assert_eq!(Target::parse(&canonical).as_ref(), Ok(&target), "{url:?}");
            let _ = (target.kind(), target.basename(), target.is_session_bound());
            // A ZooKeeper target's servers are a connect string the session accepts.
            if let Target::ZooKeeper {
                servers, chroot, ..
            } = &target
            {
                let connect = format!("{}{}", servers.join(","), chroot.as_deref().unwrap_or(""));
                assert!(parse_connect(&connect).is_ok(), "{url:?}: {connect:?}");
            }
        }
        Err(e) => {
            let message = e.to_string();
            assert!(message.contains("expected"), "{message}");
        }
    }
    // The ZooKeeper connect string parser sees operator-given strings too.
    let _ = parse_connect(url);
});
