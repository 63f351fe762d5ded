//! The GGUF container (llama.cpp's `gguf` format, versions 2 and 3): a header, metadata
//! key/value pairs, tensor descriptions, then aligned tensor data. Parsed from the mapping
//! with every length checked against the bytes left, so a truncated or corrupt file costs
//! an error naming the file and the offset, never an allocation its header asks for.

use std::collections::BTreeMap;
use std::path::Path;

use super::types::GgmlType;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64).or(match *self {
                Value::I8(v) => Some(v as f64),
                Value::I16(v) => Some(v as f64),
                Value::I32(v) => Some(v as f64),
                Value::I64(v) => Some(v as f64),
                _ => None,
            }),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A short name of the value's type, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::U8(_) | Value::U16(_) | Value::U32(_) | Value::U64(_) => "unsigned integer",
            Value::I8(_) | Value::I16(_) | Value::I32(_) | Value::I64(_) => "integer",
            Value::F32(_) | Value::F64(_) => "float",
            Value::Bool(_) => "bool",
            Value::Str(_) => "string",
            Value::Array(_) => "array",
        }
    }
}

/// One tensor's description: its name, dimensions in ggml's order (`ne[0]` innermost, so a
/// `[rows, cols]` matrix is `[cols, rows]`), type, and absolute byte range in the file.
#[derive(Clone, Debug)]
pub struct TensorDesc {
    pub name: String,
    pub ne: Vec<u64>,
    pub ty: GgmlType,
    pub start: usize,
    pub end: usize,
}

/// A parsed GGUF header: metadata and tensor descriptions.
#[derive(Debug)]
pub struct Header {
    pub meta: BTreeMap<String, Value>,
    pub tensors: Vec<TensorDesc>,
}

/// What went wrong, and where (a byte offset in the file).
#[derive(Debug)]
pub struct ParseError {
    pub offset: u64,
    pub reason: String,
}

const MAGIC: &[u8; 4] = b"GGUF";
/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;
const DEFAULT_ALIGNMENT: u64 = 32;

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn err(&self, reason: impl Into<String>) -> ParseError {
        ParseError {
            offset: self.at as u64,
            reason: reason.into(),
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ParseError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| {
            self.err(format!(
                "the file ends inside {what} ({n} bytes needed, {} left): it is truncated",
                self.bytes.len() - self.at
            ))
        })?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], ParseError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, ParseError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, ParseError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn string(&mut self, what: &str) -> Result<String, ParseError> {
        let n = self.u64(what)?;
        if n > self.left() as u64 {
            return Err(self.err(format!(
                "{what} claims {n} bytes, more than the {} left in the file: it is truncated or \
                 corrupt",
                self.left()
            )));
        }
        let at = self.at;
        let raw = self.take(n as usize, what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| ParseError {
            offset: at as u64,
            reason: format!("{what} is not UTF-8"),
        })
    }

    fn value(&mut self, ty: u32, key: &str, depth: u8) -> Result<Value, ParseError> {
        let what = || format!("the value of `{key}`");
        Ok(match ty {
            0 => Value::U8(self.array::<1>(&what())?[0]),
            1 => Value::I8(self.array::<1>(&what())?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(&what())?)),
            3 => Value::I16(i16::from_le_bytes(self.array(&what())?)),
            4 => Value::U32(self.u32(&what())?),
            5 => Value::I32(i32::from_le_bytes(self.array(&what())?)),
            6 => Value::F32(f32::from_le_bytes(self.array(&what())?)),
            7 => match self.array::<1>(&what())?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.err(format!("`{key}` is a bool of value {b}"))),
            },
            8 => Value::Str(self.string(&what())?),
            9 if depth == 0 => self.array_value(key)?,
            10 => Value::U64(self.u64(&what())?),
            11 => Value::I64(i64::from_le_bytes(self.array(&what())?)),
            12 => Value::F64(f64::from_le_bytes(self.array(&what())?)),
            9 => return Err(self.err(format!("`{key}` nests arrays, which GGUF readers refuse"))),
            t => return Err(self.err(format!("`{key}` has unknown value type {t}"))),
        })
    }

    fn array_value(&mut self, key: &str) -> Result<Value, ParseError> {
        let ty = self.u32(&format!("the element type of `{key}`"))?;
        let n = self.u64(&format!("the length of `{key}`"))?;
        // Every element takes at least one byte: a longer claim is corrupt, and refusing it
        // here bounds the allocation below by the file's size.
        if n > self.left() as u64 {
            return Err(self.err(format!(
                "`{key}` claims {n} elements, more than the {} bytes left in the file: it is \
                 truncated or corrupt",
                self.left()
            )));
        }
        let mut items = Vec::with_capacity(n as usize);
        for _ in 0..n {
            items.push(self.value(ty, key, 1)?);
        }
        Ok(Value::Array(items))
    }
}

/// Parses the header of the GGUF file `bytes` (all of it: tensor ranges are checked against
/// its length).
pub fn parse(bytes: &[u8]) -> Result<Header, ParseError> {
    let mut c = Cursor { bytes, at: 0 };
    if bytes.len() >= 4 && &bytes[..4] != MAGIC {
        return Err(c.err(format!(
            "not a GGUF file: it starts with {:?}, not \"GGUF\"",
            String::from_utf8_lossy(&bytes[..4])
        )));
    }
    c.take(4, "the magic \"GGUF\"")?;
    let version = c.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(c.err(format!(
            "GGUF version {version}: this reader knows versions 2 and 3"
        )));
    }
    let n_tensors = c.u64("the tensor count")?;
    let n_kv = c.u64("the metadata count")?;
    let mut meta = BTreeMap::new();
    for i in 0..n_kv {
        let key = c.string(&format!("metadata key {i}"))?;
        let ty = c.u32(&format!("the type of `{key}`"))?;
        let value = c.value(ty, &key, 0)?;
        if meta.insert(key.clone(), value).is_some() {
            return Err(c.err(format!("metadata key `{key}` appears twice")));
        }
    }
    let align = alignment(&meta).map_err(|r| c.err(r))?;
    let descs = tensor_descs(&mut c, n_tensors)?;
    let data_start = c.at.next_multiple_of(align as usize);
    let tensors = place(descs, data_start, bytes.len())?;
    Ok(Header { meta, tensors })
}

fn alignment(meta: &BTreeMap<String, Value>) -> Result<u64, String> {
    match meta.get("general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(Value::U32(a)) if a.is_power_of_two() => Ok(*a as u64),
        Some(v) => Err(format!(
            "`general.alignment` is {v:?}; GGUF needs a power of two as a u32"
        )),
    }
}

/// A tensor as its description gives it: name, dimensions, type, data offset, and where the
/// description starts (for messages).
struct RawDesc {
    name: String,
    ne: Vec<u64>,
    ty: GgmlType,
    offset: u64,
    at: usize,
}

/// Each tensor's description, in file order.
fn tensor_descs(c: &mut Cursor, n: u64) -> Result<Vec<RawDesc>, ParseError> {
    // A description takes at least 24 bytes (name length, dimension count, type, offset).
    if n > c.left() as u64 / 24 {
        return Err(c.err(format!(
            "the header claims {n} tensors, more than its {} remaining bytes can describe: \
                 it is truncated or corrupt",
            c.left()
        )));
    }
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let at = c.at;
        let name = c.string(&format!("the name of tensor {i}"))?;
        let dims = c.u32(&format!("the dimension count of `{name}`"))?;
        if dims == 0 || dims > MAX_DIMS {
            return Err(c.err(format!(
                "`{name}` has {dims} dimensions; ggml tensors have 1 to {MAX_DIMS}"
            )));
        }
        let mut ne = Vec::with_capacity(dims as usize);
        for _ in 0..dims {
            ne.push(c.u64(&format!("the dimensions of `{name}`"))?);
        }
        let id = c.u32(&format!("the type of `{name}`"))?;
        let ty = GgmlType::from_id(id).ok_or_else(|| ParseError {
            offset: at as u64,
            reason: format!("`{name}` has unknown ggml type {id}"),
        })?;
        let offset = c.u64(&format!("the data offset of `{name}`"))?;
        out.push(RawDesc {
            name,
            ne,
            ty,
            offset,
            at,
        });
    }
    Ok(out)
}

/// Each tensor's absolute byte range, checked to be whole blocks, in the file and apart
/// from the others.
fn place(
    descs: Vec<RawDesc>,
    data_start: usize,
    file_len: usize,
) -> Result<Vec<TensorDesc>, ParseError> {
    let mut tensors = Vec::with_capacity(descs.len());
    for RawDesc {
        name,
        ne,
        ty,
        offset,
        at,
    } in descs
    {
        let bad = |reason: String| ParseError {
            offset: at as u64,
            reason,
        };
        let len = ty.byte_len(&ne).ok_or_else(|| {
            bad(format!(
                "`{name}` of type {} has dimensions {ne:?}, not whole blocks of {} values \
                 (or too many values)",
                ty.name(),
                ty.block_elems()
            ))
        })?;
        let start = (data_start as u64).checked_add(offset);
        let end = start.and_then(|s| s.checked_add(len));
        match (start, end) {
            (Some(s), Some(e)) if e <= file_len as u64 => tensors.push(TensorDesc {
                name,
                ne,
                ty,
                start: s as usize,
                end: e as usize,
            }),
            _ => {
                return Err(bad(format!(
                    "the data of `{name}` ({len} bytes at offset {offset} of the data that starts \
                     at byte {data_start}) runs past the end of the file ({file_len} bytes): \
                     it is truncated"
                )))
            }
        }
    }
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| tensors[i].start);
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        if a.end > b.start {
            return Err(ParseError {
                offset: 0,
                reason: format!("the data of `{}` and `{}` overlap", a.name, b.name),
            });
        }
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(t) = tensors.iter().find(|t| !seen.insert(t.name.as_str())) {
        return Err(ParseError {
            offset: 0,
            reason: format!("tensor `{}` appears twice", t.name),
        });
    }
    Ok(tensors)
}

/// Whether `path` names a GGUF file (by its first four bytes; a missing file is not).
pub fn is_gguf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == MAGIC
}
