//! Typed reads out of the JSON whose errors carry the field's path in the file (e.g.
//! `rope_parameters.compress.factor`), plus the few value readers both flavours share.

use serde_json::{Map, Value};

use super::{invalid, ConfigError, ScoringFunc};

pub(super) struct Fields<'a> {
    pub(super) obj: &'a Map<String, Value>,
    prefix: String,
}

impl<'a> Fields<'a> {
    pub(super) fn root(obj: &'a Map<String, Value>) -> Self {
        Fields {
            obj,
            prefix: String::new(),
        }
    }

    pub(super) fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// `null` counts as absent, as it does for HF's optional fields.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    pub(super) fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub(super) fn usize(&self, key: &str) -> Result<Option<usize>, ConfigError> {
        self.get(key)
            .map(|v| to_usize(v, &self.name(key)))
            .transpose()
    }

    pub(super) fn usize_or(&self, key: &str, default: usize) -> Result<usize, ConfigError> {
        Ok(self.usize(key)?.unwrap_or(default))
    }

    pub(super) fn req_usize(&self, key: &str) -> Result<usize, ConfigError> {
        self.usize(key)?.ok_or_else(|| ConfigError::Missing {
            field: self.name(key),
        })
    }

    pub(super) fn f64(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        self.get(key)
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| invalid(self.name(key), json_kind(v), "must be a number"))
            })
            .transpose()
    }

    pub(super) fn f64_or(&self, key: &str, default: f64) -> Result<f64, ConfigError> {
        Ok(self.f64(key)?.unwrap_or(default))
    }

    pub(super) fn bool_or(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| invalid(self.name(key), json_kind(v), "must be true or false")),
        }
    }

    pub(super) fn str(&self, key: &str) -> Result<Option<&'a str>, ConfigError> {
        self.get(key)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| invalid(self.name(key), json_kind(v), "must be a string"))
            })
            .transpose()
    }

    pub(super) fn obj(&self, key: &str) -> Result<Option<Fields<'a>>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(obj)) => Ok(Some(Fields {
                obj,
                prefix: format!("{}.", self.name(key)),
            })),
            Some(v) => Err(invalid(self.name(key), json_kind(v), "must be an object")),
        }
    }

    fn list(&self, key: &str) -> Result<Option<&'a Vec<Value>>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(invalid(self.name(key), json_kind(v), "must be a list")),
        }
    }

    pub(super) fn usize_list(&self, key: &str) -> Result<Option<Vec<usize>>, ConfigError> {
        let Some(list) = self.list(key)? else {
            return Ok(None);
        };
        let items = list.iter().enumerate();
        items
            .map(|(i, v)| to_usize(v, &format!("{}[{i}]", self.name(key))))
            .collect::<Result<_, _>>()
            .map(Some)
    }

    pub(super) fn str_list(
        &self,
        key: &str,
    ) -> Result<Option<Vec<(String, &'a str)>>, ConfigError> {
        let Some(list) = self.list(key)? else {
            return Ok(None);
        };
        let mut out = Vec::with_capacity(list.len());
        for (i, v) in list.iter().enumerate() {
            let field = format!("{}[{i}]", self.name(key));
            let s = v
                .as_str()
                .ok_or_else(|| invalid(&field, json_kind(v), "must be a string"))?;
            out.push((field, s));
        }
        Ok(Some(out))
    }
}

/// Integers may arrive as `4` or `4.0` depending on which tool wrote the file.
pub(super) fn to_usize(v: &Value, field: &str) -> Result<usize, ConfigError> {
    if let Some(u) = v.as_u64() {
        return usize::try_from(u).map_err(|_| invalid(field, u, "too large"));
    }
    match v.as_f64() {
        Some(x) if x >= 0.0 && x.fract() == 0.0 && x < 2f64.powi(53) => Ok(x as usize),
        _ => Err(invalid(
            field,
            json_kind(v),
            "must be a non-negative integer",
        )),
    }
}

fn to_token_id(v: &Value, field: &str) -> Result<u32, ConfigError> {
    let u = to_usize(v, field)?;
    u32::try_from(u).map_err(|_| invalid(field, u, "token id does not fit in u32"))
}

pub(super) fn scoring(field: &str, s: &str) -> Result<ScoringFunc, ConfigError> {
    match s {
        "sqrtsoftplus" => Ok(ScoringFunc::SqrtSoftplus),
        "softmax" => Ok(ScoringFunc::Softmax),
        "sigmoid" => Ok(ScoringFunc::Sigmoid),
        other => Err(invalid(
            field,
            format!("{other:?}"),
            "expected sqrtsoftplus, softmax or sigmoid",
        )),
    }
}

/// `bos_token_id` absent means the flavour default; explicit `null` means none.
pub(super) fn token_ids(
    f: &Fields,
    default_bos: Option<u32>,
    default_eos: &[u32],
) -> Result<(Option<u32>, Vec<u32>), ConfigError> {
    let bos = match f.obj.get("bos_token_id") {
        None => default_bos,
        Some(Value::Null) => None,
        Some(v) => Some(to_token_id(v, "bos_token_id")?),
    };
    let eos = match f.obj.get("eos_token_id") {
        None => default_eos.to_vec(),
        Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, v)| to_token_id(v, &format!("eos_token_id[{i}]")))
            .collect::<Result<_, _>>()?,
        Some(v) => vec![to_token_id(v, "eos_token_id")?],
    };
    Ok((bos, eos))
}

pub(super) fn json_kind(v: &Value) -> String {
    match v {
        Value::Object(_) => "an object".into(),
        Value::Array(_) => "an array".into(),
        other => other.to_string(),
    }
}
