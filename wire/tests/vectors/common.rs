//! Loading and reading the vector files strictly.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::{Map, Value};

/// The vector directory.
pub struct Vectors {
    pub dir: PathBuf,
}

impl Vectors {
    /// Opens `STRAND_VECTORS`, or `../shared/vectors` from the workspace root; panics (fails the
    /// test) when it does not exist.
    pub fn open() -> Vectors {
        let dir = match std::env::var_os("STRAND_VECTORS") {
            Some(dir) => PathBuf::from(dir),
            None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/vectors"),
        };
        assert!(
            dir.is_dir(),
            "golden vectors not found at {} (set STRAND_VECTORS to the vector directory)",
            dir.display()
        );
        Vectors { dir }
    }

    pub fn file_names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.dir)
            .expect("read vector directory")
            .map(|e| e.expect("dir entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    pub fn has(&self, name: &str) -> bool {
        self.dir.join(name).is_file()
    }

    /// Parses one file; its top-level object must be readable.
    pub fn json(&self, name: &str) -> Value {
        let path = self.dir.join(name);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }
}

/// Fails when `object` has a top-level key outside `known` (plus `generated_from` and `set`,
/// which every file carries): an unknown section means the test has fallen behind.
pub fn expect_sections(object: &Value, known: &[&str]) {
    let object = object.as_object().expect("top-level object");
    let allowed: BTreeSet<&str> = known.iter().copied().chain(["generated_from", "set"]).collect();
    for key in object.keys() {
        assert!(allowed.contains(key.as_str()), "unknown top-level section {key:?}");
    }
}

pub fn obj(value: &Value) -> &Map<String, Value> {
    value.as_object().unwrap_or_else(|| panic!("expected an object, got {value}"))
}

pub fn get<'a>(value: &'a Value, key: &str) -> &'a Value {
    obj(value).get(key).unwrap_or_else(|| panic!("missing key {key:?} in {}", short(value)))
}

pub fn opt<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
    obj(value).get(key).filter(|v| !v.is_null())
}

pub fn arr<'a>(value: &'a Value, key: &str) -> &'a [Value] {
    get(value, key).as_array().unwrap_or_else(|| panic!("{key:?} is not an array"))
}

pub fn string<'a>(value: &'a Value, key: &str) -> &'a str {
    get(value, key).as_str().unwrap_or_else(|| panic!("{key:?} is not a string"))
}

pub fn boolean(value: &Value, key: &str) -> bool {
    get(value, key).as_bool().unwrap_or_else(|| panic!("{key:?} is not a bool"))
}

/// An unsigned integer: a JSON number (below 2^32) or a decimal string (u64/u128).
pub fn uint(value: &Value, key: &str) -> u128 {
    as_uint(get(value, key)).unwrap_or_else(|| panic!("{key:?} is not an unsigned integer"))
}

pub fn as_uint(value: &Value) -> Option<u128> {
    match value {
        Value::Number(n) => n.as_u64().map(u128::from),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// Raw bytes from a `_hex` string.
pub fn hex(value: &Value, key: &str) -> Vec<u8> {
    decode_hex(string(value, key))
}

pub fn decode_hex(text: &str) -> Vec<u8> {
    let text = text.strip_prefix("0x").unwrap_or(text);
    assert!(text.len().is_multiple_of(2), "odd-length hex string");
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap_or_else(|_| panic!("bad hex {text:?}")))
        .collect()
}

pub fn header_of(frame: &[u8]) -> [u8; 256] {
    frame[..256].try_into().expect("frame holds a header")
}

pub fn name(value: &Value) -> String {
    opt(value, "name").and_then(Value::as_str).unwrap_or("<unnamed>").to_string()
}

fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.len() > 200 { format!("{}...", &text[..200]) } else { text }
}
