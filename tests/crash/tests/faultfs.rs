//! faultfs through the kernel: what was fsynced (file and directory entry) survives a power
//! cut, what was not vanishes, and an injected fsync failure reaches the caller.
//!
//! Needs root and /dev/fuse (it mounts); without them it says SKIPPED and passes.

use sepp_crash::faultfs::FaultFs;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::Ordering;

fn can_mount() -> bool {
    let root = rustix::process::geteuid().is_root();
    if !root || !Path::new("/dev/fuse").exists() {
        eprintln!("SKIPPED faultfs: needs root and /dev/fuse");
        return false;
    }
    true
}

fn read(p: &Path) -> Option<Vec<u8>> {
    let mut v = Vec::new();
    File::open(p).ok()?.read_to_end(&mut v).ok()?;
    Some(v)
}

#[test]
fn a_power_cut_keeps_what_was_fsynced_and_drops_the_rest() {
    if !can_mount() {
        return;
    }
    let tmp = std::env::temp_dir().join(format!("faultfs-test-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let fs = FaultFs::new();
    let session = fs.mount(&tmp).expect("mount");

    let dir = tmp.join("data");
    std::fs::create_dir(&dir).unwrap();
    File::open(&tmp).unwrap().sync_all().unwrap();
    let mut f = File::create(dir.join("synced")).unwrap();
    f.write_all(b"durable").unwrap();
    f.sync_all().unwrap();
    f.write_all(b" and not").unwrap();
    let mut g = File::create(dir.join("unsynced-entry")).unwrap();
    g.write_all(b"x").unwrap();
    g.sync_data().unwrap();
    File::open(&dir).unwrap().sync_all().unwrap();
    let mut h = File::create(dir.join("late")).unwrap();
    h.write_all(b"late").unwrap();
    h.sync_all().unwrap();
    drop((f, g, h));
    assert_eq!(read(&dir.join("synced")).unwrap(), b"durable and not");

    session.umount_and_join().unwrap();
    let report = fs.power_cut(false);
    let session = fs.mount(&tmp).expect("remount");
    assert_eq!(read(&dir.join("synced")).unwrap(), b"durable");
    assert_eq!(read(&dir.join("unsynced-entry")).unwrap(), b"x");
    assert!(
        read(&dir.join("late")).is_none(),
        "its entry was never fsynced"
    );
    assert!(
        report.dirty_chunks >= 1 && report.nodes_dropped == 1,
        "{report:?}"
    );

    // An injected fsync failure reaches the caller, and the data it was to save is gone
    // after the next cut even though a later fsync succeeded.
    let mut f = OpenOptions::new()
        .append(true)
        .open(dir.join("synced"))
        .unwrap();
    f.write_all(b"!").unwrap();
    fs.faults.fail_fsyncs.store(1, Ordering::Relaxed);
    assert!(f.sync_all().is_err());
    f.sync_all().unwrap();
    drop(f);
    session.umount_and_join().unwrap();
    fs.power_cut(false);
    let session = fs.mount(&tmp).expect("remount");
    // The size may have been saved by the later fsync; the byte was not.
    let after = read(&dir.join("synced")).unwrap();
    assert_eq!(&after[..7], b"durable");
    assert_ne!(after.get(7), Some(&b'!'), "{after:?}");
    session.umount_and_join().unwrap();
    let _ = std::fs::remove_dir(&tmp);
}
