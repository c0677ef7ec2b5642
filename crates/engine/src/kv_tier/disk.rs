//! The disk tier: one file per block under `DIR/<fingerprint>/`, where the fingerprint hashes the
//! model's identity and the KV page layout (written out beside the blocks in `identity.txt`).
//!
//! One file per block rather than one big file: a block is written whole and renamed into place,
//! so a crash or a full disk loses at most the block being written; eviction is an unlink, with
//! no free-space map to keep; and a damaged file costs only its own block. Each file carries a
//! header with the fingerprint, the block's hash, its parent's hash, its token ids, the pages'
//! length and a CRC-32 of the pages, itself covered by a CRC-32. A restarted server reopens the
//! directory by reading the headers; a file whose header is foreign (another model or layout),
//! damaged or whose length is wrong is ignored with a warning, and the pages' checksum is checked
//! again every time a block is loaded, so a tampered file is never loaded.
//!
//! Writes and unlinks run on a thread of their own, in order; until a write is done its pages
//! are served from memory.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

use super::TierBlock;
use crate::kv_transfer::KvPageLayout;

const MAGIC: &[u8; 8] = b"PGDKVB01";
/// Magic, fingerprint, hash, parent flag, parent, token count, pages' length.
const FIXED_HEADER: usize = 8 + 8 + 8 + 1 + 8 + 4 + 8;
const EXTENSION: &str = "kvb";

/// Why the disk tier could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DiskTierError {
    #[error("the KV disk tier's directory {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("could not start the KV disk tier's writer thread: {0}")]
    Spawn(std::io::Error),
}

/// The fingerprint of a model identity and page layout: blocks are loaded only into an engine
/// with the same.
pub fn fingerprint(identity: &str, layout: &KvPageLayout) -> u64 {
    super::text_hash(&format!("{identity}\n{layout:?}"))
}

/// What a block file's header says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Header {
    fingerprint: u64,
    hash: u64,
    parent: Option<u64>,
    tokens: Box<[u32]>,
    pages_len: u64,
    pages_crc: u32,
}

impl Header {
    fn len(&self) -> usize {
        FIXED_HEADER + 4 * self.tokens.len() + 8
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.fingerprint.to_le_bytes());
        out.extend_from_slice(&self.hash.to_le_bytes());
        out.push(u8::from(self.parent.is_some()));
        out.extend_from_slice(&self.parent.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&(self.tokens.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.pages_len.to_le_bytes());
        for t in &self.tokens {
            out.extend_from_slice(&t.to_le_bytes());
        }
        out.extend_from_slice(&self.pages_crc.to_le_bytes());
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Reads a header from the start of a block file; `Err` says why it is not one of ours.
    fn read(file: &mut impl Read, block_size: usize) -> Result<Self, String> {
        let mut fixed = [0u8; FIXED_HEADER];
        file.read_exact(&mut fixed).map_err(|e| format!("header cut short ({e})"))?;
        if &fixed[..8] != MAGIC {
            return Err("not a Pagoda KV block file".into());
        }
        let u64_at = |at: usize| u64::from_le_bytes(fixed[at..at + 8].try_into().expect("8 bytes"));
        let n_tokens = u32::from_le_bytes(fixed[33..37].try_into().expect("4 bytes")) as usize;
        if n_tokens != block_size {
            return Err(format!("{n_tokens} tokens in a block of {block_size}"));
        }
        let mut rest = vec![0u8; 4 * n_tokens + 8];
        file.read_exact(&mut rest).map_err(|e| format!("header cut short ({e})"))?;
        let crc_at = rest.len() - 4;
        let stored_crc = u32::from_le_bytes(rest[crc_at..].try_into().expect("4 bytes"));
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&fixed);
        hasher.update(&rest[..crc_at]);
        if hasher.finalize() != stored_crc {
            return Err("header checksum mismatch".into());
        }
        let tokens = rest[..4 * n_tokens]
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes(w.try_into().expect("4")))
            .collect();
        Ok(Self {
            fingerprint: u64_at(8),
            hash: u64_at(16),
            parent: (fixed[24] != 0).then(|| u64_at(25)),
            tokens,
            pages_len: u64_at(37),
            pages_crc: u32::from_le_bytes(rest[crc_at - 4..crc_at].try_into().expect("4 bytes")),
        })
    }
}

/// A block the index knows, on disk or being written.
#[derive(Debug)]
struct Entry {
    parent: Option<u64>,
    tokens: Box<[u32]>,
    tick: u64,
}

enum Op {
    Write { hash: u64, serial: u64, header: Vec<u8>, block: TierBlock },
    Remove { hash: u64 },
    Sync(mpsc::Sender<()>),
}

/// A write the writer thread finished: `Err` when the block is not on disk.
struct Done {
    hash: u64,
    serial: u64,
    result: Result<(), String>,
}

/// A directory of block files, LRU within a byte bound.
#[derive(Debug)]
pub struct DiskStore {
    dir: PathBuf,
    capacity: u64,
    fingerprint: u64,
    block_size: usize,
    block_bytes: usize,
    bytes: u64,
    index: HashMap<u64, Entry>,
    /// Last-use tick -> hash, least recently used first.
    order: BTreeMap<u64, u64>,
    tick: u64,
    /// Blocks handed to the writer and not yet written: served from here meanwhile.
    pending: HashMap<u64, (u64, TierBlock)>,
    serial: u64,
    ops: Option<mpsc::Sender<Op>>,
    done: mpsc::Receiver<Done>,
    writer: Option<JoinHandle<()>>,
    refused_at_open: u64,
    refused: u64,
    /// Blocks dropped since [`Self::take_removed`].
    removed: Vec<u64>,
}

fn block_path(dir: &Path, hash: u64) -> PathBuf {
    dir.join(format!("{hash:016x}.{EXTENSION}"))
}

impl DiskStore {
    /// Opens (creating it if needed) the tier under `root` for `identity` and `layout`, indexing
    /// the intact blocks a previous run left there, least recently written first out.
    pub fn open(
        root: &Path,
        capacity: u64,
        identity: &str,
        layout: &KvPageLayout,
    ) -> Result<Self, DiskTierError> {
        let fingerprint = fingerprint(identity, layout);
        let dir = root.join(format!("{fingerprint:016x}"));
        let io = |source| DiskTierError::Io { path: dir.clone(), source };
        fs::create_dir_all(&dir).map_err(io)?;
        fs::write(dir.join("identity.txt"), format!("{identity}\n{layout:?}\n")).map_err(io)?;
        let (ops, op_rx) = mpsc::channel();
        let (done_tx, done) = mpsc::channel();
        let writer_dir = dir.clone();
        let writer = std::thread::Builder::new()
            .name("pagoda-kv-disk".into())
            .spawn(move || write_blocks(&writer_dir, op_rx, done_tx))
            .map_err(DiskTierError::Spawn)?;
        let mut store = Self {
            dir: dir.clone(),
            capacity,
            fingerprint,
            block_size: layout.block_size,
            block_bytes: layout.block_bytes(),
            bytes: 0,
            index: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            pending: HashMap::new(),
            serial: 0,
            ops: Some(ops),
            done,
            writer: Some(writer),
            refused_at_open: 0,
            refused: 0,
            removed: Vec::new(),
        };
        let mut found = Vec::new();
        for item in fs::read_dir(&dir).map_err(io)? {
            let path = item.map_err(io)?.path();
            match path.extension().and_then(|e| e.to_str()) {
                Some(EXTENSION) => {}
                // A write cut short by a crash.
                Some("tmp") => {
                    let _ = fs::remove_file(&path);
                    continue;
                }
                _ => continue,
            }
            match store.read_header(&path) {
                Ok((header, modified)) => found.push((modified, header)),
                Err(why) => {
                    tracing::warn!(path = %path.display(), "KV disk tier: ignoring a block file: {why}");
                    store.refused_at_open += 1;
                }
            }
        }
        found.sort_by_key(|(modified, _)| *modified);
        for (_, header) in found {
            store.insert(header.hash, header.parent, header.tokens);
        }
        store.evict_to(0);
        tracing::info!(
            dir = %dir.display(),
            blocks = store.index.len(),
            bytes = store.bytes,
            refused = store.refused_at_open,
            "KV disk tier opened"
        );
        Ok(store)
    }

    /// Bytes of pages held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The directory the blocks are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Block files ignored when the tier was opened.
    pub fn refused_at_open(&self) -> u64 {
        self.refused_at_open
    }

    /// Blocks refused at load since the last call (their files failed a check).
    pub fn take_refused(&mut self) -> u64 {
        std::mem::take(&mut self.refused)
    }

    /// Whether the index holds `hash`.
    pub fn contains(&self, hash: u64) -> bool {
        self.index.contains_key(&hash)
    }

    /// Whether the index holds `hash` with `tokens` after `parent` (no I/O).
    pub fn probe(&self, hash: u64, parent: Option<u64>, tokens: &[u32]) -> bool {
        self.index.get(&hash).is_some_and(|e| e.parent == parent && *e.tokens == *tokens)
    }

    /// Stores a block (its write runs on the writer thread); false when it is held already or
    /// cannot fit.
    pub fn put(&mut self, hash: u64, block: TierBlock) -> bool {
        self.poll();
        if self.index.contains_key(&hash) || block.pages.len() as u64 > self.capacity {
            return false;
        }
        let header = Header {
            fingerprint: self.fingerprint,
            hash,
            parent: block.parent,
            tokens: block.tokens.clone(),
            pages_len: block.pages.len() as u64,
            pages_crc: crc32fast::hash(&block.pages),
        };
        self.evict_to(block.pages.len() as u64);
        self.insert(hash, block.parent, block.tokens.clone());
        self.serial += 1;
        self.pending.insert(hash, (self.serial, block.clone()));
        self.send(Op::Write { hash, serial: self.serial, header: header.encode(), block });
        true
    }

    /// The block `hash` holding `tokens` after `parent`, read and checked; a file that fails a
    /// check is dropped from the tier with a warning and counted as refused.
    pub fn fetch(&mut self, hash: u64, parent: Option<u64>, tokens: &[u32]) -> Option<TierBlock> {
        self.poll();
        if !self.probe(hash, parent, tokens) {
            return None;
        }
        self.touch(hash);
        if let Some((_, block)) = self.pending.get(&hash) {
            return Some(block.clone());
        }
        let path = block_path(&self.dir, hash);
        match self.read_block(&path, hash) {
            Ok(block) if block.matches(parent, tokens) => Some(block),
            Ok(_) => self.refuse(hash, &path, "its header names other tokens than the index"),
            Err(why) => self.refuse(hash, &path, &why),
        }
    }

    /// The blocks dropped since the last call (evicted, refused, or not written).
    pub fn take_removed(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.removed)
    }

    /// Waits until every write handed over so far is done.
    pub fn sync(&mut self) {
        let (tx, rx) = mpsc::channel();
        self.send(Op::Sync(tx));
        let _ = rx.recv();
        self.poll();
    }

    fn refuse(&mut self, hash: u64, path: &Path, why: &str) -> Option<TierBlock> {
        tracing::warn!(path = %path.display(), "KV disk tier: refusing a block file: {why}");
        self.refused += 1;
        self.remove(hash);
        None
    }

    fn read_header(&self, path: &Path) -> Result<(Header, std::time::SystemTime), String> {
        let mut file = fs::File::open(path).map_err(|e| e.to_string())?;
        let meta = file.metadata().map_err(|e| e.to_string())?;
        let header = Header::read(&mut file, self.block_size)?;
        self.check_header(&header, path, meta.len())?;
        Ok((header, meta.modified().unwrap_or(std::time::UNIX_EPOCH)))
    }

    fn check_header(&self, header: &Header, path: &Path, file_len: u64) -> Result<(), String> {
        if header.fingerprint != self.fingerprint {
            return Err(format!(
                "written for another model or cache layout (fingerprint {:016x}, this one {:016x})",
                header.fingerprint, self.fingerprint
            ));
        }
        if header.pages_len != self.block_bytes as u64 {
            return Err(format!("{} bytes of pages, a block has {}", header.pages_len, self.block_bytes));
        }
        if file_len != header.len() as u64 + header.pages_len {
            return Err(format!(
                "{file_len} bytes long, expected {}",
                header.len() as u64 + header.pages_len
            ));
        }
        if path.file_stem().and_then(|s| s.to_str()) != Some(&format!("{:016x}", header.hash)) {
            return Err(format!("holds block {:016x}, not the one its name says", header.hash));
        }
        Ok(())
    }

    fn read_block(&self, path: &Path, hash: u64) -> Result<TierBlock, String> {
        let bytes = fs::read(path).map_err(|e| e.to_string())?;
        let header = Header::read(&mut bytes.as_slice(), self.block_size)?;
        self.check_header(&header, path, bytes.len() as u64)?;
        if header.hash != hash {
            return Err("holds another block".into());
        }
        let pages = &bytes[header.len()..];
        if crc32fast::hash(pages) != header.pages_crc {
            return Err("the pages' checksum does not match (the file was changed)".into());
        }
        Ok(TierBlock { parent: header.parent, tokens: header.tokens, pages: pages.into() })
    }

    fn insert(&mut self, hash: u64, parent: Option<u64>, tokens: Box<[u32]>) {
        self.tick += 1;
        self.order.insert(self.tick, hash);
        self.index.insert(hash, Entry { parent, tokens, tick: self.tick });
        self.bytes += self.block_bytes as u64;
    }

    fn touch(&mut self, hash: u64) {
        self.tick += 1;
        if let Some(entry) = self.index.get_mut(&hash) {
            self.order.remove(&entry.tick);
            entry.tick = self.tick;
            self.order.insert(self.tick, hash);
        }
    }

    fn remove(&mut self, hash: u64) {
        if let Some(entry) = self.index.remove(&hash) {
            self.order.remove(&entry.tick);
            self.bytes -= self.block_bytes as u64;
            self.pending.remove(&hash);
            self.removed.push(hash);
            self.send(Op::Remove { hash });
        }
    }

    /// Evicts least recently used blocks until `incoming` more bytes fit.
    fn evict_to(&mut self, incoming: u64) {
        while self.bytes + incoming > self.capacity {
            let Some((&tick, &victim)) = self.order.first_key_value() else { break };
            if self.index.contains_key(&victim) {
                self.remove(victim);
            } else {
                self.order.remove(&tick);
            }
        }
    }

    /// Takes the writer's reports: a write that failed drops its block from the index.
    fn poll(&mut self) {
        while let Ok(done) = self.done.try_recv() {
            if self.pending.get(&done.hash).is_some_and(|(serial, _)| *serial == done.serial) {
                self.pending.remove(&done.hash);
                if let Err(why) = done.result {
                    tracing::warn!("KV disk tier: could not write block {:016x}: {why}", done.hash);
                    self.remove(done.hash);
                }
            }
        }
    }

    fn send(&self, op: Op) {
        if let Some(ops) = &self.ops {
            let _ = ops.send(op);
        }
    }
}

impl Drop for DiskStore {
    /// Lets the writer finish what it was handed, so that a clean shutdown keeps every block.
    fn drop(&mut self) {
        self.ops.take();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// The writer thread: writes each block to a temporary file and renames it into place, unlinks
/// evicted ones, in the order they were asked for.
fn write_blocks(dir: &Path, ops: mpsc::Receiver<Op>, done: mpsc::Sender<Done>) {
    for op in ops {
        match op {
            Op::Write { hash, serial, header, block } => {
                let path = block_path(dir, hash);
                let tmp = path.with_extension("tmp");
                let result = fs::File::create(&tmp)
                    .and_then(|mut f| {
                        f.write_all(&header)?;
                        f.write_all(&block.pages)
                    })
                    .and_then(|()| fs::rename(&tmp, &path))
                    .map_err(|e| {
                        let _ = fs::remove_file(&tmp);
                        e.to_string()
                    });
                let _ = done.send(Done { hash, serial, result });
            }
            Op::Remove { hash } => {
                let _ = fs::remove_file(block_path(dir, hash));
            }
            Op::Sync(reply) => {
                let _ = reply.send(());
            }
        }
    }
}
