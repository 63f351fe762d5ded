//! Request bodies are deserialised straight from their bytes into typed fields, never through
//! a `serde_json::Value` (a tree of a million numbers costs ten times their text). Each
//! endpoint reads the fields every generation endpoint shares ([`super::SamplingFields`]) and
//! its own in two passes over the bytes; each pass skips what it does not know without
//! allocating it, as vLLM ignores unknown fields. Object keys keep the client's order and
//! integers their digits (chat tool schemas are rendered into the prompt as sent), and a
//! wrong type is reported with the JSON path of the offending field as OpenAI's `param`.

use super::ApiError;
use serde::de::DeserializeOwned;

/// Deserialises the body into `T`, naming the offending field on failure.
pub fn fields<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|&b| b != b'{') {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(bytes))
        .map_err(path_error)
}

fn path_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    if inner.is_syntax() || inner.is_eof() {
        return ApiError::bad_request(format!("the request body is not valid JSON: {inner}"));
    }
    if path == "." || path.is_empty() {
        ApiError::bad_request(inner.to_string())
    } else {
        ApiError::invalid(path.clone(), format!("invalid `{path}`: {inner}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize, Debug)]
    struct T {
        #[allow(dead_code)]
        temperature: Option<f32>,
        #[allow(dead_code)]
        stop: Option<Vec<String>>,
    }

    #[test]
    fn names_the_field_with_the_wrong_type() {
        let e = fields::<T>(br#"{"temperature": "hot", "other": 1}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        assert!(e.message.contains("invalid type"), "{}", e.message);
        let e = fields::<T>(br#"{"stop": ["a", 3]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stop[1]"));
    }

    #[test]
    fn rejects_non_objects_and_bad_json() {
        for bad in [
            &b"[1]"[..],
            b" 7",
            b"",
            b"{\"a\":",
            b"{\"temperature\": 1,}",
        ] {
            let e = fields::<T>(bad).unwrap_err();
            assert_eq!(e.param, None, "{}", String::from_utf8_lossy(bad));
        }
        assert!(fields::<T>(b"{\"zzz\": {\"deep\": [1, 2, \"x\"]}}").is_ok());
    }
}
