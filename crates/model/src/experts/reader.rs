//! Reading one routed expert from the shard files into a slab: every range it needs (three
//! code tensors, their scales) merged into as few positioned reads as the file layout
//! allows, with `O_DIRECT` where the file system takes it, so a streamed expert neither
//! fills the page cache nor counts twice against the memory budget.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::SystemTime;

use deepinfer_kernels::buffer::Slab;

use super::{ExpertError, ExpertSource};
use crate::checkpoint::FileRange;
use crate::experts::ExpertWeights;
use crate::linear::Linear;

/// Direct reads need offsets, lengths and buffers aligned to the device's logical block;
/// 4 KiB covers every common one.
const DIRECT_ALIGN: u64 = 4096;
/// Ranges closer than this are read as one (the bytes between are cheaper than a second
/// request).
const MERGE_GAP: u64 = 64 << 10;
/// Where each matrix's codes start in a slab (the kernels' vector loads like 64).
const SLAB_ALIGN: usize = 64;

/// One shard file, opened for positioned reads, with what it looked like at load.
struct ShardFile {
    path: PathBuf,
    file: File,
    /// Opened without `O_DIRECT` (the file system refused it): reads are plain.
    buffered: File,
    direct: AtomicBool,
    len: u64,
    modified: Option<SystemTime>,
}

impl ShardFile {
    fn open(path: &Path) -> Result<Self, ExpertError> {
        let io = |e: std::io::Error| ExpertError::Io {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        let buffered = File::open(path).map_err(io)?;
        let meta = buffered.metadata().map_err(io)?;
        let direct = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path);
        let (file, direct) = match direct {
            Ok(f) => (f, true),
            Err(_) => (buffered.try_clone().map_err(io)?, false),
        };
        Ok(Self {
            path: path.to_path_buf(),
            file,
            buffered,
            direct: AtomicBool::new(direct),
            len: meta.len(),
            modified: meta.modified().ok(),
        })
    }

    /// A checkpoint is an immutable input; one rewritten or truncated since load would give
    /// other bytes than the plan was checked against, so it is refused instead.
    fn check_unchanged(&self) -> Result<(), ExpertError> {
        let meta = self.buffered.metadata().map_err(|e| ExpertError::Io {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        if meta.len() != self.len || meta.modified().ok() != self.modified {
            return Err(ExpertError::Changed {
                path: self.path.clone(),
                len_then: self.len,
                len_now: meta.len(),
            });
        }
        Ok(())
    }

    /// Reads `[start, start + buf.len())` into `buf` (aligned for direct reads), returning
    /// how many bytes came (fewer only at the end of the file).
    fn read_at(&self, buf: &mut [u8], start: u64) -> Result<usize, ExpertError> {
        let mut done = 0;
        while done < buf.len() {
            let direct = self.direct.load(Ordering::Relaxed);
            let file = if direct { &self.file } else { &self.buffered };
            match file.read_at(&mut buf[done..], start + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // A file system that opens with O_DIRECT but rejects the alignment.
                Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                    self.direct.store(false, Ordering::Relaxed);
                }
                Err(e) => {
                    return Err(ExpertError::Io {
                        path: self.path.clone(),
                        reason: e.to_string(),
                    })
                }
            }
        }
        Ok(done)
    }
}

/// Reads experts from the checkpoint's shard files.
pub(super) struct Reader {
    files: Vec<ShardFile>,
}

/// One read: a file span covering one or more of an expert's ranges.
struct Span {
    file: usize,
    start: u64,
    end: u64,
}

/// An I/O thread's bounce buffer for direct reads (grown to the largest span it has read).
#[derive(Default)]
pub(super) struct Bounce(Option<Slab>);

impl Reader {
    pub fn open(paths: &[&Path]) -> Result<Self, ExpertError> {
        let files = paths
            .iter()
            .map(|p| ShardFile::open(p))
            .collect::<Result<_, _>>()?;
        Ok(Self { files })
    }

    /// Whether every shard file reads around the page cache.
    pub fn direct(&self) -> bool {
        self.files.iter().all(|f| f.direct.load(Ordering::Relaxed))
    }

    /// The slab bytes one expert needs: its code tensors back to back, each 64-aligned.
    pub fn slab_bytes(src: &ExpertSource) -> usize {
        src.parts
            .iter()
            .map(|p| p.codes.len.next_multiple_of(SLAB_ALIGN))
            .sum()
    }

    /// Reads expert `src` into `slab` and builds its matrices over it; returns the weights
    /// and the bytes read from disk.
    pub fn read(
        &self,
        src: &ExpertSource,
        slab: &mut Slab,
        bounce: &mut Bounce,
    ) -> Result<(ExpertWeights, u64), ExpertError> {
        // Where each part's codes go in the slab.
        let mut offsets = [0usize; 3];
        let mut at = 0;
        for (o, p) in offsets.iter_mut().zip(&src.parts) {
            *o = at;
            at += p.codes.len.next_multiple_of(SLAB_ALIGN);
        }
        let mut scales: [Vec<u8>; 3] = Default::default();
        let mut read = 0;
        {
            let dst = slab.bytes_mut().ok_or(ExpertError::Busy)?;
            if dst.len() < at {
                return Err(ExpertError::Busy);
            }
            for span in spans(src) {
                let got = self.read_span(&span, bounce)?;
                read += got.len() as u64;
                for (i, p) in src.parts.iter().enumerate() {
                    if let Some(b) = cut(&span, got, p.codes) {
                        dst[offsets[i]..offsets[i] + b.len()].copy_from_slice(b);
                    }
                    if let Some(b) = p.scales.and_then(|r| cut(&span, got, r)) {
                        scales[i] = b.to_vec();
                    }
                }
            }
        }
        let build = |i: usize| -> Result<Linear, ExpertError> {
            let p = &src.parts[i];
            let view = slab
                .view(offsets[i], p.codes.len)
                .ok_or(ExpertError::Busy)?;
            let w = p
                .build(view, &scales[i])
                .map_err(|e| ExpertError::Invalid {
                    reason: e.to_string(),
                })?;
            Ok(Linear { w })
        };
        let weights = ExpertWeights {
            w1: build(0)?,
            w2: build(1)?,
            w3: build(2)?,
        };
        Ok((weights, read))
    }

    /// The bytes of `span`, read whole (a short read is an error: the file is shorter than
    /// its header said when it was opened).
    fn read_span<'b>(&self, span: &Span, bounce: &'b mut Bounce) -> Result<&'b [u8], ExpertError> {
        let f = &self.files[span.file];
        f.check_unchanged()?;
        let start = span.start / DIRECT_ALIGN * DIRECT_ALIGN;
        let end = span.end.next_multiple_of(DIRECT_ALIGN);
        let len = (end - start) as usize;
        if bounce.0.as_ref().is_none_or(|s| s.capacity() < len) {
            bounce.0 = Some(Slab::new(len).ok_or(ExpertError::OutOfMemory { bytes: len })?);
        }
        let buf = bounce
            .0
            .as_mut()
            .and_then(|s| s.bytes_mut())
            .ok_or(ExpertError::Busy)?;
        let got = f.read_at(&mut buf[..len], start)?;
        let needed = (span.end - start) as usize;
        if got < needed {
            return Err(ExpertError::Truncated {
                path: f.path.clone(),
                needed: span.end,
                actual: start + got as u64,
            });
        }
        Ok(&buf[(span.start - start) as usize..needed])
    }
}

/// The part of `range` inside `span`, whose bytes are `got` (ranges never straddle spans).
fn cut<'a>(span: &Span, got: &'a [u8], range: FileRange) -> Option<&'a [u8]> {
    let inside = range.file == span.file && range.offset >= span.start && range.end() <= span.end;
    inside.then(|| {
        let o = (range.offset - span.start) as usize;
        &got[o..o + range.len]
    })
}

/// The expert's ranges merged into spans: sorted by file and offset, neighbours closer than
/// [`MERGE_GAP`] joined.
fn spans(src: &ExpertSource) -> Vec<Span> {
    let mut ranges: Vec<FileRange> = src
        .parts
        .iter()
        .flat_map(|p| std::iter::once(p.codes).chain(p.scales))
        .filter(|r| r.len > 0)
        .collect();
    ranges.sort_by_key(|r| (r.file, r.offset));
    let mut out: Vec<Span> = Vec::new();
    for r in ranges {
        match out.last_mut() {
            Some(s) if s.file == r.file && r.offset <= s.end + MERGE_GAP => {
                s.end = s.end.max(r.end())
            }
            _ => out.push(Span {
                file: r.file,
                start: r.offset,
                end: r.end(),
            }),
        }
    }
    out
}

/// Read bandwidth of the file at `path` in GB/s: `threads` threads each reading `block`
/// bytes at a time, in file order (`random = false`) or at random block-aligned offsets,
/// `total` bytes in all (at most the file's size when sequential), direct where the file
/// system allows (else the page cache may serve repeats).
pub fn file_read_bandwidth(
    path: &Path,
    block: usize,
    threads: usize,
    total: usize,
    random: bool,
) -> Result<f64, ExpertError> {
    let f = ShardFile::open(path)?;
    let block = (block as u64)
        .next_multiple_of(DIRECT_ALIGN)
        .max(DIRECT_ALIGN);
    let blocks = (f.len / block).max(1);
    let count = (total as u64 / block)
        .max(1)
        .min(if random { u64::MAX } else { blocks });
    let init = || {
        Slab::new(block as usize).ok_or(ExpertError::OutOfMemory {
            bytes: block as usize,
        })
    };
    read_rate(threads, count, init, |slab, i| {
        // A fixed odd multiplier walks every block once per `blocks` reads.
        let b = if random {
            i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % blocks
        } else {
            i
        };
        let buf = slab.bytes_mut().ok_or(ExpertError::Busy)?;
        Ok(f.read_at(&mut buf[..block as usize], b * block)? as u64)
    })
}

/// The read rate in GB/s of `count` reads shared out among `threads` threads: each thread
/// makes its buffers with `init`, then `read(buffers, i)` does read `i` and says how many
/// bytes it read.
pub(super) fn read_rate<S>(
    threads: usize,
    count: u64,
    init: impl Fn() -> Result<S, ExpertError> + Sync,
    read: impl Fn(&mut S, u64) -> Result<u64, ExpertError> + Sync,
) -> Result<f64, ExpertError> {
    let next = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    let start = std::time::Instant::now();
    std::thread::scope(|s| -> Result<(), ExpertError> {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| -> Result<(), ExpertError> {
                    let mut state = init()?;
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= count {
                            return Ok(());
                        }
                        bytes.fetch_add(read(&mut state, i)?, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| ExpertError::Busy)??;
        }
        Ok(())
    })?;
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    Ok(bytes.load(Ordering::Relaxed) as f64 / secs / 1e9)
}
