//! A ZooKeeper queue entry: its name (sequence suffix), data and stat, as read from
//! the lock's children.
#![no_main]
use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use lockwarden::backend::ZkLock;
use lockwarden::backend::zookeeper::sequence_of;
use zookeeper_client::Stat;

#[derive(Arbitrary, Debug)]
struct Node {
    name: String,
    data: Vec<u8>,
    czxid: i64,
    ctime: i64,
    mtime: i64,
    version: i32,
    lease_ms: u32,
}

fuzz_target!(|node: Node| {
    if let Some(sequence) = sequence_of(&node.name) {
        // Only a run of ASCII digits at the end is a sequence: never negative.
        assert!(sequence >= 0 && node.name.ends_with(|c: char| c.is_ascii_digit()));
    }
    let stat = Stat {
        czxid: node.czxid,
        mzxid: node.czxid,
        pzxid: node.czxid,
        ctime: node.ctime,
        mtime: node.mtime,
        version: node.version,
        cversion: 0,
        aversion: 0,
        ephemeral_owner: 1,
        data_length: node.data.len() as i32,
        num_children: 0,
    };
    let stored = ZkLock::stored(&node.name, &node.data, &stat);
    assert!(stored.version.0.starts_with(&node.name));
    let lease = Duration::from_millis(u64::from(node.lease_ms).max(1));
    let holder = ZkLock::holder_record(&node.name, stored, &stat, lease);
    if holder.nonce.is_empty() {
        // A foreign entry is its name plus a bounded description of its data.
        let bound = node.name.len() + lockwarden::lock::ForeignRecord::MAX_LEN + 64;
        assert!(
            holder.holder.len() <= bound,
            "{} bytes",
            holder.holder.len()
        );
    }
});
