//! Request bodies are parsed twice from one `serde_json::Value`: once into the fields every
//! generation endpoint shares ([`super::SamplingFields`]) and once into the endpoint's own.
//! Both ignore fields they do not know (as vLLM does), and a wrong type is reported with the
//! JSON path of the offending field as OpenAI's `param`.

use super::ApiError;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Parses the raw body into a JSON object, or says why it is not one.
pub fn body_object(bytes: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    Ok(v)
}

/// Deserialises `v` into `T`, naming the offending field on failure.
pub fn fields<T: DeserializeOwned>(v: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(path_error)
}

/// Like [`fields`], straight from the body bytes: object keys keep the client's order and
/// integers their digits (chat tool schemas are rendered into the prompt as sent).
pub fn fields_from_bytes<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(bytes))
        .map_err(path_error)
}

fn path_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
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
        let v = body_object(br#"{"temperature": "hot", "other": 1}"#).unwrap();
        let e = fields::<T>(&v).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        assert!(e.message.contains("invalid type"), "{}", e.message);
        let v = body_object(br#"{"stop": ["a", 3]}"#).unwrap();
        assert_eq!(
            fields::<T>(&v).unwrap_err().param.as_deref(),
            Some("stop[1]")
        );
    }

    #[test]
    fn rejects_non_objects_and_bad_json() {
        assert!(body_object(b"[1]").is_err());
        assert!(body_object(b"{\"a\":").is_err());
        assert!(fields::<T>(&body_object(b"{\"zzz\": 1}").unwrap()).is_ok());
    }
}
