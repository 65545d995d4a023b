//! Q4_1 weights re-encoded as Q8_0, once, into a GGUF beside the original.
//!
//! llama.cpp's CPU backend has no matrix-matrix kernel for Q4_1: prompt
//! evaluation falls back to one dot product per (weight row, token) pair,
//! which is where nearly all of a prompt's time goes (measured: 84% of it
//! in `ggml_vec_dot_q4_1_q8_1` for SmolLM2-135M Q4_1). Q8_0 has a tiled
//! matrix-matrix kernel (llamafile's tinyBLAS), so the same weights as
//! Q8_0 evaluate a 300-token prompt in 30–40% less time on 2 cores (run
//! back to back with the Q4_1 file), with generation no slower. Every
//! Q4_1 value is `d·q + m` with 16 levels per block of 32; Q8_0 stores
//! the same block with 255 levels, so each weight moves by at most 1/254
//! of the block's largest magnitude, a fraction of one Q4_1 step (greedy
//! replies start the same: tests/weights.rs). The copy is written
//! atomically (a temporary file, then a rename) and named after the
//! source's size and mtime, so processes loading at the same time and a
//! replaced source are safe.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::UNIX_EPOCH;

const GGUF_MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
const TYPE_Q4_1: u32 = 3;
const TYPE_Q8_0: u32 = 8;
/// Values per block, in both formats.
const QK: usize = 32;
const Q4_1_BLOCK: usize = 20;
const Q8_0_BLOCK: usize = 34;
/// GGUF metadata value types.
const GGUF_TYPE_STRING: u32 = 8;
const GGUF_TYPE_ARRAY: u32 = 9;
const GGUF_TYPE_UINT32: u32 = 4;

/// Why a GGUF was used as it is rather than re-encoded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WeightsError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not a GGUF file this converter understands: {0}")]
    Format(String),
}

/// One tensor's entry in the GGUF header.
struct TensorInfo {
    name: Vec<u8>,
    dims: Vec<u64>,
    ty: u32,
    offset: u64,
}

impl TensorInfo {
    fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// The parsed header: raw metadata bytes (copied verbatim) and tensors.
struct Header {
    version: u32,
    n_kv: u64,
    metadata: Vec<u8>,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    /// Where tensor data starts in the source.
    data_start: u64,
}

/// The GGUF to load for `source`: a Q8_0 copy of it when it holds Q4_1
/// weights (made now if missing), else `source` itself. Falls back to
/// `source` when the copy cannot be made (read-only directory, unknown
/// layout): only speed is lost.
pub(crate) fn prepared(source: &Path) -> PathBuf {
    match prepare(source) {
        Ok(Some(path)) => path,
        Ok(None) => source.to_path_buf(),
        Err(e) => {
            tracing::info!(
                path = %source.display(),
                error = %e,
                "could not re-encode Q4_1 weights as Q8_0; loading them as they are (slower prompts)"
            );
            source.to_path_buf()
        }
    }
}

fn prepare(source: &Path) -> Result<Option<PathBuf>, WeightsError> {
    // Beside the real file, not a symlink to it: every link shares one copy.
    let source = &std::fs::canonicalize(source)?;
    let mut reader = BufReader::new(File::open(source)?);
    let header = read_header(&mut reader)?;
    if !header.tensors.iter().any(|t| t.ty == TYPE_Q4_1) {
        return Ok(None);
    }
    let target = copy_path(source)?;
    if target.is_file() {
        return Ok(Some(target));
    }
    let started = std::time::Instant::now();
    // Unique per process and per call: tests load models from several
    // threads of one process at once.
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let tmp = target.with_extension(format!(
        "q8_0.tmp-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    let written = write_q8_0(&mut reader, &header, &tmp);
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, &target)?;
    remove_stale_copies(source, &target);
    tracing::info!(
        source = %source.display(),
        copy = %target.display(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "re-encoded Q4_1 weights as Q8_0 for faster prompt evaluation"
    );
    Ok(Some(target))
}

/// Copies made for an earlier version of `source` (its size or mtime
/// changed): 145 MB each for SmolLM2-135M, and never read again.
fn remove_stale_copies(source: &Path, current: &Path) {
    let (Some(dir), Some(file)) = (source.parent(), source.file_name()) else {
        return;
    };
    let prefix = format!("{}.", file.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path != current && name.starts_with(&prefix) && name.ends_with(".q8_0") {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// `<dir>/<file>.<size>-<mtime>.q8_0`: a changed source gets a new copy,
/// and the name does not end in `.gguf`, so listings of models ignore it.
fn copy_path(source: &Path) -> Result<PathBuf, WeightsError> {
    let meta = std::fs::metadata(source)?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let file = source
        .file_name()
        .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
    Ok(source.with_file_name(format!("{file}.{}-{mtime}.q8_0", meta.len())))
}

fn read_exact<const N: usize>(r: &mut impl Read) -> Result<[u8; N], WeightsError> {
    let mut buf = [0u8; N];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

fn read_u32(r: &mut impl Read) -> Result<u32, WeightsError> {
    Ok(u32::from_le_bytes(read_exact(r)?))
}

fn read_u64(r: &mut impl Read) -> Result<u64, WeightsError> {
    Ok(u64::from_le_bytes(read_exact(r)?))
}

/// Reads `n` bytes, refusing absurd lengths from a corrupt header.
fn read_bytes(r: &mut impl Read, n: u64) -> Result<Vec<u8>, WeightsError> {
    if n > 1 << 30 {
        return Err(WeightsError::Format(format!("a {n}-byte field")));
    }
    let mut buf = vec![0u8; n as usize];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

/// Bytes of one scalar metadata value of type `ty` (strings excluded).
fn scalar_size(ty: u32) -> Result<u64, WeightsError> {
    Ok(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        other => return Err(WeightsError::Format(format!("metadata type {other}"))),
    })
}

/// Reads one metadata value of type `ty`, appending its bytes to `out`.
fn copy_value(r: &mut impl Read, ty: u32, out: &mut Vec<u8>) -> Result<(), WeightsError> {
    match ty {
        GGUF_TYPE_STRING => {
            let len = read_u64(r)?;
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&read_bytes(r, len)?);
        }
        GGUF_TYPE_ARRAY => {
            let item = read_u32(r)?;
            let n = read_u64(r)?;
            out.extend_from_slice(&item.to_le_bytes());
            out.extend_from_slice(&n.to_le_bytes());
            if item == GGUF_TYPE_STRING || item == GGUF_TYPE_ARRAY {
                for _ in 0..n {
                    copy_value(r, item, out)?;
                }
            } else {
                let size = n
                    .checked_mul(scalar_size(item)?)
                    .ok_or_else(|| WeightsError::Format("array size".into()))?;
                out.extend_from_slice(&read_bytes(r, size)?);
            }
        }
        _ => out.extend_from_slice(&read_bytes(r, scalar_size(ty)?)?),
    }
    Ok(())
}

fn read_header<R: Read + Seek>(r: &mut R) -> Result<Header, WeightsError> {
    let magic: [u8; 4] = read_exact(r)?;
    if &magic != GGUF_MAGIC {
        return Err(WeightsError::Format("bad magic".into()));
    }
    let version = read_u32(r)?;
    if !(2..=3).contains(&version) {
        return Err(WeightsError::Format(format!("version {version}")));
    }
    let n_tensors = read_u64(r)?;
    let n_kv = read_u64(r)?;
    let mut metadata = Vec::new();
    let mut alignment = DEFAULT_ALIGNMENT;
    for _ in 0..n_kv {
        let key_len = read_u64(r)?;
        let key = read_bytes(r, key_len)?;
        let ty = read_u32(r)?;
        metadata.extend_from_slice(&key_len.to_le_bytes());
        metadata.extend_from_slice(&key);
        metadata.extend_from_slice(&ty.to_le_bytes());
        let start = metadata.len();
        copy_value(r, ty, &mut metadata)?;
        if key == b"general.alignment" && ty == GGUF_TYPE_UINT32 {
            let mut raw = [0u8; 4];
            raw.copy_from_slice(&metadata[start..start + 4]);
            alignment = u64::from(u32::from_le_bytes(raw)).max(1);
        }
    }
    let mut tensors = Vec::new();
    for _ in 0..n_tensors {
        let name_len = read_u64(r)?;
        let name = read_bytes(r, name_len)?;
        let n_dims = read_u32(r)?;
        if n_dims > 8 {
            return Err(WeightsError::Format(format!("{n_dims} dimensions")));
        }
        let dims = (0..n_dims)
            .map(|_| read_u64(r))
            .collect::<Result<Vec<_>, _>>()?;
        let ty = read_u32(r)?;
        let offset = read_u64(r)?;
        tensors.push(TensorInfo {
            name,
            dims,
            ty,
            offset,
        });
    }
    let data_start = r.stream_position()?.next_multiple_of(alignment);
    Ok(Header {
        version,
        n_kv,
        metadata,
        tensors,
        alignment,
        data_start,
    })
}

/// Writes the GGUF with every Q4_1 tensor re-encoded as Q8_0.
fn write_q8_0<R: Read + Seek>(
    r: &mut R,
    header: &Header,
    target: &Path,
) -> Result<(), WeightsError> {
    // Source byte sizes come from the gaps between offsets (the last runs
    // to the end of the file), so types this module does not know are
    // copied exactly as they are.
    let file_len = r.seek(SeekFrom::End(0))?;
    let mut by_offset: Vec<usize> = (0..header.tensors.len()).collect();
    by_offset.sort_by_key(|&i| header.tensors[i].offset);
    let mut src_size = vec![0u64; header.tensors.len()];
    for (k, &i) in by_offset.iter().enumerate() {
        let end = by_offset
            .get(k + 1)
            .map_or(file_len.saturating_sub(header.data_start), |&j| {
                header.tensors[j].offset
            });
        src_size[i] = end.saturating_sub(header.tensors[i].offset);
    }
    let mut new_size = vec![0u64; header.tensors.len()];
    for (i, t) in header.tensors.iter().enumerate() {
        new_size[i] = if t.ty == TYPE_Q4_1 {
            let elements = t.elements();
            if elements % QK as u64 != 0 || src_size[i] < elements / QK as u64 * Q4_1_BLOCK as u64 {
                return Err(WeightsError::Format("a truncated Q4_1 tensor".into()));
            }
            elements / QK as u64 * Q8_0_BLOCK as u64
        } else {
            src_size[i]
        };
    }
    let mut new_offset = vec![0u64; header.tensors.len()];
    let mut at = 0u64;
    for &i in &by_offset {
        new_offset[i] = at;
        at = (at + new_size[i]).next_multiple_of(header.alignment);
    }

    let mut w = BufWriter::with_capacity(1 << 20, File::create(target)?);
    w.write_all(GGUF_MAGIC)?;
    w.write_all(&header.version.to_le_bytes())?;
    w.write_all(&(header.tensors.len() as u64).to_le_bytes())?;
    w.write_all(&header.n_kv.to_le_bytes())?;
    w.write_all(&header.metadata)?;
    let mut written = 24 + header.metadata.len() as u64;
    for (i, t) in header.tensors.iter().enumerate() {
        let ty = if t.ty == TYPE_Q4_1 { TYPE_Q8_0 } else { t.ty };
        let mut entry = Vec::with_capacity(t.name.len() + 32 + 8 * t.dims.len());
        entry.extend_from_slice(&(t.name.len() as u64).to_le_bytes());
        entry.extend_from_slice(&t.name);
        entry.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            entry.extend_from_slice(&d.to_le_bytes());
        }
        entry.extend_from_slice(&ty.to_le_bytes());
        entry.extend_from_slice(&new_offset[i].to_le_bytes());
        w.write_all(&entry)?;
        written += entry.len() as u64;
    }
    pad(&mut w, &mut written, header.alignment)?;
    let data_start = written;
    for &i in &by_offset {
        let t = &header.tensors[i];
        r.seek(SeekFrom::Start(header.data_start + t.offset))?;
        let bytes = if t.ty == TYPE_Q4_1 {
            t.elements() / QK as u64 * Q4_1_BLOCK as u64
        } else {
            src_size[i]
        };
        let src = read_bytes(r, bytes)?;
        let out = if t.ty == TYPE_Q4_1 {
            q4_1_to_q8_0(&src)
        } else {
            src
        };
        w.write_all(&out)?;
        written += out.len() as u64;
        let target_len = data_start + new_offset[i] + new_size[i];
        pad_to(&mut w, &mut written, target_len)?;
        pad(&mut w, &mut written, header.alignment)?;
    }
    w.flush()?;
    w.into_inner()
        .map_err(|e| WeightsError::Io(e.into_error()))?
        .sync_all()?;
    Ok(())
}

fn pad(w: &mut impl Write, written: &mut u64, alignment: u64) -> Result<(), WeightsError> {
    let target = written.next_multiple_of(alignment);
    pad_to(w, written, target)
}

fn pad_to(w: &mut impl Write, written: &mut u64, target: u64) -> Result<(), WeightsError> {
    while *written < target {
        w.write_all(&[0])?;
        *written += 1;
    }
    Ok(())
}

/// Q4_1 blocks (`d`, `m` as f16, 16 bytes of nibbles: the low nibbles are
/// values 0–15, the high ones 16–31) to Q8_0 blocks (`d` as f16, 32 i8),
/// quantised as ggml's own `quantize_row_q8_0` does.
pub(crate) fn q4_1_to_q8_0(src: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(src.len() / Q4_1_BLOCK * Q8_0_BLOCK);
    let mut values = [0f32; QK];
    for block in src.chunks_exact(Q4_1_BLOCK) {
        let d = f16_to_f32(u16::from_le_bytes([block[0], block[1]]));
        let m = f16_to_f32(u16::from_le_bytes([block[2], block[3]]));
        for (j, byte) in block[4..].iter().enumerate() {
            values[j] = f32::from(byte & 0x0f) * d + m;
            values[j + QK / 2] = f32::from(byte >> 4) * d + m;
        }
        let amax = values.iter().fold(0f32, |a, v| a.max(v.abs()));
        let scale = amax / 127.0;
        let inverse = if scale == 0.0 { 0.0 } else { 1.0 / scale };
        out.extend_from_slice(&f32_to_f16(scale).to_le_bytes());
        for v in values {
            // In range by construction: |v · inverse| <= 127.
            out.push((v * inverse).round().clamp(-127.0, 127.0) as i8 as u8);
        }
    }
    out
}

/// IEEE half to single precision.
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: normalise.
            let mut e = 127 - 15 + 1;
            let mut m = man;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | (e << 23) | ((m & 0x3ff) << 13)
        }
        (0x1f, _) => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// Single to half precision, rounding to nearest even.
pub(crate) fn f32_to_f16(f: f32) -> u16 {
    let bits = f.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1u32 << shift) - 1);
        let mut v = m >> shift;
        if rest > half || (rest == half && v & 1 == 1) {
            v += 1;
        }
        return sign | v as u16;
    }
    let mut v = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && v & 1 == 1) {
        v += 1;
    }
    sign | v as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_precision_round_trips() {
        for h in [
            0x0000u16, 0x3c00, 0xbc00, 0x0001, 0x03ff, 0x0400, 0x7bff, 0x3555,
        ] {
            assert_eq!(f32_to_f16(f16_to_f32(h)), h, "{h:#06x}");
        }
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f32_to_f16(0.5), 0x3800);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(1e9), 0x7c00);
        // 1 + 2^-11 is halfway between 1 and the next half: ties to even.
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
    }

    #[test]
    fn q8_0_copy_stays_within_a_fraction_of_a_q4_1_step() {
        let d = 0.013f32;
        let m = -0.11f32;
        let mut block = Vec::new();
        block.extend_from_slice(&f32_to_f16(d).to_le_bytes());
        block.extend_from_slice(&f32_to_f16(m).to_le_bytes());
        for j in 0..16u8 {
            block.push(j | ((15 - j) << 4));
        }
        let out = q4_1_to_q8_0(&block);
        assert_eq!(out.len(), Q8_0_BLOCK);
        let (dq, mq) = (
            f16_to_f32(u16::from_le_bytes([block[0], block[1]])),
            f16_to_f32(u16::from_le_bytes([block[2], block[3]])),
        );
        let scale = f16_to_f32(u16::from_le_bytes([out[0], out[1]]));
        for j in 0..QK {
            let nibble = if j < 16 { j as f32 } else { (31 - j) as f32 };
            let original = nibble * dq + mq;
            let copy = f32::from(out[2 + j] as i8) * scale;
            assert!(
                (original - copy).abs() <= dq / 8.0,
                "value {j}: {original} became {copy}"
            );
        }
    }

    fn gguf_string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }

    /// A GGUF with metadata, a 64-value tensor of type `q_type` (with Q4_1
    /// data) and a 3-value F32 one.
    fn tiny_gguf(q_type: u32) -> (Vec<u8>, Vec<u8>) {
        let mut q4 = Vec::new();
        for b in 0..2u8 {
            q4.extend_from_slice(&f32_to_f16(0.25).to_le_bytes());
            q4.extend_from_slice(&f32_to_f16(-1.0 - f32::from(b)).to_le_bytes());
            q4.extend((0..16u8).map(|j| j | (j << 4)));
        }
        let mut g = b"GGUF".to_vec();
        g.extend_from_slice(&3u32.to_le_bytes());
        g.extend_from_slice(&2u64.to_le_bytes());
        g.extend_from_slice(&2u64.to_le_bytes());
        gguf_string(&mut g, "general.name");
        g.extend_from_slice(&GGUF_TYPE_STRING.to_le_bytes());
        gguf_string(&mut g, "tiny");
        gguf_string(&mut g, "tokenizer.ggml.tokens");
        g.extend_from_slice(&GGUF_TYPE_ARRAY.to_le_bytes());
        g.extend_from_slice(&GGUF_TYPE_STRING.to_le_bytes());
        g.extend_from_slice(&2u64.to_le_bytes());
        gguf_string(&mut g, "a");
        gguf_string(&mut g, "bc");
        for (name, n, ty, offset) in [("q", 64u64, q_type, 0u64), ("f", 3, 0, 64)] {
            gguf_string(&mut g, name);
            g.extend_from_slice(&1u32.to_le_bytes());
            g.extend_from_slice(&n.to_le_bytes());
            g.extend_from_slice(&ty.to_le_bytes());
            g.extend_from_slice(&offset.to_le_bytes());
        }
        g.resize(g.len().next_multiple_of(32), 0);
        g.extend_from_slice(&q4);
        g.resize(g.len().next_multiple_of(32), 0);
        for v in [1.5f32, -2.0, 3.25] {
            g.extend_from_slice(&v.to_le_bytes());
        }
        (g, q4)
    }

    #[test]
    fn a_gguf_is_rewritten_with_q8_0_in_place_of_q4_1() {
        let (gguf, q4) = tiny_gguf(TYPE_Q4_1);
        let dir = std::env::temp_dir().join(format!("keel-weights-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let source = dir.join("tiny.gguf");
        std::fs::write(&source, &gguf).unwrap();

        let copy = prepare(&source).unwrap().unwrap();
        assert_eq!(prepare(&source).unwrap().unwrap(), copy, "made once");
        // A replaced source gets a new copy; the old one goes.
        let stale = source.with_file_name("tiny.gguf.1-2.q8_0");
        std::fs::write(&stale, b"old").unwrap();
        std::fs::remove_file(&copy).unwrap();
        assert_eq!(prepare(&source).unwrap().unwrap(), copy);
        assert!(!stale.exists(), "the stale copy is removed");
        let links = dir.join("links");
        std::fs::create_dir_all(&links).unwrap();
        std::os::unix::fs::symlink(&source, links.join("tiny.gguf")).unwrap();
        assert_eq!(
            prepare(&links.join("tiny.gguf")).unwrap().unwrap(),
            copy,
            "a symlink shares the real file's copy"
        );
        let bytes = std::fs::read(&copy).unwrap();
        let mut r = std::io::Cursor::new(bytes.clone());
        let header = read_header(&mut r).unwrap();
        let original = read_header(&mut std::io::Cursor::new(gguf)).unwrap();
        assert_eq!(
            header.metadata, original.metadata,
            "metadata copied verbatim"
        );
        assert_eq!(header.n_kv, 2);
        let types: Vec<u32> = header.tensors.iter().map(|t| t.ty).collect();
        assert_eq!(types, [TYPE_Q8_0, 0]);
        let q = &header.tensors[0];
        let f = &header.tensors[1];
        assert_eq!(q.dims, [64]);
        assert_eq!(f.offset % 32, 0);
        let at = |o: u64| (header.data_start + o) as usize;
        assert_eq!(
            &bytes[at(q.offset)..at(q.offset) + 2 * Q8_0_BLOCK],
            q4_1_to_q8_0(&q4).as_slice()
        );
        let floats: Vec<f32> = bytes[at(f.offset)..at(f.offset) + 12]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(floats, [1.5, -2.0, 3.25]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_gguf_without_q4_1_is_used_as_it_is() {
        // Q4_0: 18-byte blocks, so the 40 data bytes are just bytes here.
        let (gguf, _) = tiny_gguf(2);
        let dir = std::env::temp_dir().join(format!("keel-weights-none-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let source = dir.join("tiny.gguf");
        std::fs::write(&source, &gguf).unwrap();
        assert!(prepare(&source).unwrap().is_none());
        assert_eq!(prepared(&source), source);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_that_is_not_gguf_is_refused() {
        let mut r = std::io::Cursor::new(b"not a gguf at all, just text".to_vec());
        assert!(matches!(read_header(&mut r), Err(WeightsError::Format(_))));
    }
}
