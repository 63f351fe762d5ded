//! What the directory holds, kept in memory by the engine thread: one record per complete
//! entry, with its size and when it was last used, so that lookups never touch the disk and
//! the directory stays under its bound (least recently used first).

use std::collections::HashMap;
use std::io;
use std::path::Path;

use super::entry::Kind;
use super::key::{from_hex, Digest};

pub type Key = (Digest, Kind);

#[derive(Clone, Copy, Debug)]
struct Meta {
    bytes: u64,
    used: u64,
    /// A block's parent block (`None` for the first block of a chain and for snapshots).
    parent: Option<Digest>,
    /// Blocks in the index whose parent this block is: only a block without any is evicted,
    /// so the directory never keeps a chain's tail without its head.
    children: u32,
}

#[derive(Debug, Default)]
pub struct Index {
    entries: HashMap<Key, Meta>,
    bytes: u64,
    clock: u64,
}

/// What a scan found besides entries.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// Temporary files of writes a killed process never finished (removed).
    pub torn: usize,
    /// Files that are not entries of this build (left alone).
    pub foreign: usize,
}

/// The key a file name spells (`<sha256 hex>.blk` or `.snap`).
pub fn key_of(name: &str) -> Option<Key> {
    let (stem, ext) = name.rsplit_once('.')?;
    let kind = [Kind::Block, Kind::Snapshot]
        .into_iter()
        .find(|k| k.extension() == ext)?;
    Some((from_hex(stem)?, kind))
}

pub fn file_name((chain, kind): &Key) -> String {
    format!("{}.{}", super::key::hex(chain), kind.extension())
}

/// Names of unfinished writes.
pub const TMP_PREFIX: &str = ".tmp-";

impl Index {
    /// Indexes `dir`, oldest modification first (a file's mtime is its last use: reads touch
    /// it), and removes the temporary files of torn writes.
    pub fn scan(dir: &Path) -> io::Result<(Self, Scan)> {
        let mut found = Vec::new();
        let mut scan = Scan::default();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(TMP_PREFIX) {
                std::fs::remove_file(e.path())?;
                scan.torn += 1;
                continue;
            }
            let meta = e.metadata()?;
            let key = key_of(&name).filter(|_| meta.is_file());
            let parent = match key {
                Some((_, Kind::Block)) => super::entry::parent_of(&e.path()).map(Some),
                Some((_, Kind::Snapshot)) => Some(None),
                None => None,
            };
            match (key, parent) {
                (Some(key), Some(parent)) => {
                    found.push((meta.modified().ok(), key, meta.len(), parent))
                }
                _ => scan.foreign += 1,
            }
        }
        found.sort_by_key(|f| f.0);
        let mut index = Self::default();
        for (_, key, bytes, parent) in found {
            index.insert(key, bytes, parent);
        }
        index.recount();
        Ok((index, scan))
    }

    /// Counts every block's children afresh.
    fn recount(&mut self) {
        let parents: Vec<Digest> = self.entries.values().filter_map(|m| m.parent).collect();
        for m in self.entries.values_mut() {
            m.children = 0;
        }
        for p in parents {
            if let Some(m) = self.entries.get_mut(&(p, Kind::Block)) {
                m.children += 1;
            }
        }
    }

    pub fn contains(&self, key: &Key) -> bool {
        self.entries.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Records a complete entry of `bytes` (a block after `parent`) as the most recently used.
    pub fn insert(&mut self, key: Key, bytes: u64, parent: Option<Digest>) {
        self.remove(&key);
        self.clock += 1;
        if let Some(p) = parent.and_then(|p| self.entries.get_mut(&(p, Kind::Block))) {
            p.children += 1;
        }
        let meta = Meta {
            bytes,
            used: self.clock,
            parent,
            // A child indexed before its parent (a scan's order) is counted by `recount`.
            children: 0,
        };
        self.entries.insert(key, meta);
        self.bytes += bytes;
    }

    pub fn touch(&mut self, key: &Key) {
        self.clock += 1;
        if let Some(m) = self.entries.get_mut(key) {
            m.used = self.clock;
        }
    }

    pub fn remove(&mut self, key: &Key) -> bool {
        let Some(m) = self.entries.remove(key) else {
            return false;
        };
        self.bytes -= m.bytes;
        if let Some(p) = m
            .parent
            .and_then(|p| self.entries.get_mut(&(p, Kind::Block)))
        {
            p.children -= 1;
        }
        true
    }

    /// Drops least recently used entries without children until at most `target` bytes
    /// remain (a block takes its snapshot along); returns them.
    pub fn shrink_to(&mut self, target: u64) -> Vec<Key> {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let leaf = |(k, m): (&Key, &Meta)| (m.children == 0).then_some(Reverse((m.used, *k)));
        let mut heap: BinaryHeap<_> = self.entries.iter().filter_map(leaf).collect();
        let mut gone = Vec::new();
        while self.bytes > target {
            let Some(Reverse((_, key))) = heap.pop() else {
                break;
            };
            let Some(&meta) = self.entries.get(&key) else {
                continue;
            };
            self.remove(&key);
            gone.push(key);
            if key.1 == Kind::Block {
                let snap = (key.0, Kind::Snapshot);
                if self.remove(&snap) {
                    gone.push(snap);
                }
            }
            let parent = meta.parent.map(|p| (p, Kind::Block));
            if let Some((p, m)) = parent.and_then(|p| self.entries.get(&p).map(|m| (p, m))) {
                if m.children == 0 {
                    heap.push(Reverse((m.used, p)));
                }
            }
        }
        gone
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_spell_keys() {
        let key = ([7u8; 32], Kind::Snapshot);
        assert_eq!(key_of(&file_name(&key)), Some(key));
        assert_eq!(key_of("lock"), None);
        assert_eq!(key_of(&format!("{}.bin", "0".repeat(64))), None);
    }

    #[test]
    fn the_least_recently_used_go_first() {
        let mut ix = Index::default();
        let (a, b, c) = (
            ([1; 32], Kind::Block),
            ([2; 32], Kind::Block),
            ([3; 32], Kind::Snapshot),
        );
        ix.insert(a, 100, None);
        ix.insert(b, 100, None);
        ix.insert(c, 50, None);
        ix.touch(&a);
        assert_eq!(ix.bytes(), 250);
        assert_eq!(ix.shrink_to(200), [b]);
        assert_eq!(ix.shrink_to(0), [c, a]);
        assert_eq!((ix.len(), ix.bytes()), (0, 0));
    }

    #[test]
    fn a_chain_goes_tail_first_with_its_snapshots() {
        let mut ix = Index::default();
        let (root, mid, tip) = ([1; 32], [2; 32], [3; 32]);
        ix.insert((root, Kind::Block), 10, None);
        ix.insert((mid, Kind::Block), 10, Some(root));
        ix.insert((tip, Kind::Block), 10, Some(mid));
        ix.insert((mid, Kind::Snapshot), 5, None);
        // The head is the least recently used, but its children hold it.
        assert_eq!(
            ix.shrink_to(11),
            [
                (tip, Kind::Block),
                (mid, Kind::Block),
                (mid, Kind::Snapshot)
            ]
        );
        assert!(ix.contains(&(root, Kind::Block)));
    }

    #[test]
    fn a_scan_indexes_entries_and_removes_torn_writes() {
        let dir = tempfile::tempdir().unwrap();
        let key = ([9; 32], Kind::Snapshot);
        std::fs::write(dir.path().join(file_name(&key)), [0u8; 10]).unwrap();
        // A block file whose header is not readable is not an entry.
        std::fs::write(
            dir.path().join(file_name(&([8; 32], Kind::Block))),
            [0u8; 3],
        )
        .unwrap();
        std::fs::write(dir.path().join(".tmp-3"), [0u8; 5]).unwrap();
        std::fs::write(dir.path().join("notes.txt"), b"x").unwrap();
        let (ix, scan) = Index::scan(dir.path()).unwrap();
        assert!(ix.contains(&key));
        assert_eq!((ix.len(), ix.bytes()), (1, 10));
        assert_eq!(
            scan,
            Scan {
                torn: 1,
                foreign: 2
            }
        );
        assert!(!dir.path().join(".tmp-3").exists());
    }
}
