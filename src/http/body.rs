//! JSON request bodies: media type, size limit and well-formedness, checked before any domain
//! code runs, each with its own problem type.

use std::future::Future;
use std::pin::Pin;

use actix_web::dev::Payload;
use actix_web::http::header::CONTENT_TYPE;
use actix_web::{FromRequest, HttpRequest};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{ApiError, FieldError};

/// The largest request body accepted: 1 MiB.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// A request body that must be present and be JSON. Kept as a [`Value`] so that the
/// idempotency fingerprint sees exactly what the client sent before it is deserialised.
#[derive(Debug)]
pub struct JsonBody(pub Value);

/// A body that may be empty; when present it must be JSON.
#[derive(Debug)]
pub struct OptionalJsonBody(pub Option<Value>);

impl FromRequest for JsonBody {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(request: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let read = read_json(request, payload);
        Box::pin(async move {
            read.await?
                .map(JsonBody)
                .ok_or_else(|| ApiError::MalformedJson("the request body is empty".to_owned()))
        })
    }
}

impl FromRequest for OptionalJsonBody {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(request: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let read = read_json(request, payload);
        Box::pin(async move { read.await.map(OptionalJsonBody) })
    }
}

fn read_json(
    request: &HttpRequest,
    payload: &mut Payload,
) -> impl Future<Output = Result<Option<Value>, ApiError>> + 'static {
    // Two Content-Type headers name no single media type.
    let mut content_types = request.headers().get_all(CONTENT_TYPE);
    let content_type = match (content_types.next(), content_types.next()) {
        (Some(value), None) => Some(value.as_bytes().to_vec()),
        (Some(_), Some(_)) => Some(Vec::new()),
        (None, _) => None,
    };
    let declared_length = request
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let stream = actix_web::body::BodyStream::new(payload.take());
    async move {
        if declared_length.is_some_and(|length| length > MAX_BODY_BYTES as u64) {
            return Err(ApiError::PayloadTooLarge { limit: MAX_BODY_BYTES });
        }
        let bytes = match actix_web::body::to_bytes_limited(stream, MAX_BODY_BYTES).await {
            Err(_limit_exceeded) => {
                return Err(ApiError::PayloadTooLarge { limit: MAX_BODY_BYTES });
            }
            Ok(Err(error)) => {
                return Err(ApiError::MalformedJson(format!("unreadable body: {error}")));
            }
            Ok(Ok(bytes)) => bytes,
        };
        if bytes.is_empty() {
            return Ok(None);
        }
        if !content_type.as_deref().is_some_and(is_json_media_type) {
            return Err(ApiError::UnsupportedMediaType);
        }
        serde_json::from_slice(&bytes).map(Some).map_err(|error| ApiError::MalformedJson(error.to_string()))
    }
}

/// `application/json` or any `application/*+json`, in UTF-8: a `charset` parameter, if any, must
/// be `utf-8` (case-insensitive, quoted or not). Other parameters are ignored. JSON is UTF-8
/// (RFC 8259); a body declared in another charset would be read as something it is not.
fn is_json_media_type(value: &[u8]) -> bool {
    let Ok(value) = std::str::from_utf8(value) else {
        return false;
    };
    let Some((essence, parameters)) = media_type(value) else {
        return false;
    };
    let json = essence == "application/json"
        || essence.strip_prefix("application/").is_some_and(|sub| sub.ends_with("+json"));
    json && parameters
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("charset"))
        .all(|(_, charset)| charset.eq_ignore_ascii_case("utf-8"))
}

/// A media type (RFC 9110 section 8.3.1): its essence in lower case and its parameters, values
/// unquoted. `None` when it is malformed.
fn media_type(value: &str) -> Option<(String, Vec<(String, String)>)> {
    let (essence, mut rest) = value.split_once(';').unwrap_or((value, ""));
    let essence = essence.trim().to_ascii_lowercase();
    let mut parameters = Vec::new();
    loop {
        rest = rest.trim_start_matches([' ', '\t', ';']);
        if rest.is_empty() {
            return Some((essence, parameters));
        }
        let (name, after) = rest.split_once('=')?;
        let (parameter_value, after) = match after.strip_prefix('"') {
            Some(quoted) => unquote(quoted)?,
            None => {
                let end = after.find(';').unwrap_or(after.len());
                (after[..end].trim_end().to_owned(), &after[end..])
            }
        };
        parameters.push((name.trim().to_owned(), parameter_value));
        rest = after;
    }
}

/// The rest of an RFC 9110 quoted-string after its opening quote: the unescaped text and what
/// follows the closing quote.
fn unquote(quoted: &str) -> Option<(String, &str)> {
    let mut text = String::new();
    let mut chars = quoted.char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => return Some((text, &quoted[at + 1..])),
            '\\' => text.push(chars.next()?.1),
            c => text.push(c),
        }
    }
    None
}

/// Deserialises a JSON value into a request DTO. A well-formed body of the wrong shape (a wrong
/// type, a missing or unknown field) is a 422 that names the field.
///
/// Every request body of this API is a JSON object (serde would otherwise read a struct from an
/// array, field by position).
pub fn deserialize<T: DeserializeOwned>(value: Value) -> Result<T, ApiError> {
    if !value.is_object() {
        return Err(ApiError::Validation(vec![FieldError::new("body", "must be a JSON object")]));
    }
    serde_path_to_error::deserialize(value).map_err(|error| {
        let path = error.path().to_string();
        let message = error.inner().to_string();
        ApiError::Validation(vec![FieldError::new(field_name(&path, &message), message)])
    })
}

/// serde reports a missing or unknown field at the parent's path; name the field itself.
fn field_name(path: &str, message: &str) -> String {
    let named = ["missing field `", "unknown field `"]
        .iter()
        .find_map(|prefix| message.strip_prefix(prefix))
        .and_then(|rest| rest.split('`').next());
    match (path, named) {
        (path, Some(field)) if path == field || path.ends_with(&format!(".{field}")) => path.to_owned(),
        (".", Some(field)) => field.to_owned(),
        (parent, Some(field)) => format!("{parent}.{field}"),
        (".", None) => "body".to_owned(),
        (path, None) => path.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_media_types() {
        assert!(is_json_media_type(b"application/json"));
        assert!(is_json_media_type(b"Application/JSON; charset=utf-8"));
        assert!(is_json_media_type(b"application/merge-patch+json"));
        assert!(!is_json_media_type(b"text/plain"));
        assert!(!is_json_media_type(b"application/x-www-form-urlencoded"));
    }

    #[test]
    fn only_utf8_json_is_accepted() {
        for accepted in [
            "application/json; charset=utf-8",
            "application/json;charset=UTF-8",
            "application/json; charset=\"utf-8\"",
            "application/json; charset=\"UTF-8\"; foo=bar",
            "application/json; foo=\"a;charset=latin1\"",
            "application/json;",
        ] {
            assert!(is_json_media_type(accepted.as_bytes()), "{accepted}");
        }
        for refused in [
            "application/json; charset=latin1",
            "application/json; charset=\"latin1\"",
            "application/json; Charset=ISO-8859-1",
            "application/json; charset=utf-16",
            "application/json; charset=utf8",
            "application/json; charset=utf-8; charset=latin1",
            "application/json; charset=\"utf-8",
            "application/json; charset",
        ] {
            assert!(!is_json_media_type(refused.as_bytes()), "{refused}");
        }
    }

    #[test]
    fn field_names_point_at_the_field() {
        assert_eq!(field_name(".", "missing field `currency`"), "currency");
        assert_eq!(field_name("items[0]", "unknown field `colour`, expected ..."), "items[0].colour");
        assert_eq!(field_name("items[0].colour", "unknown field `colour`, expected ..."), "items[0].colour");
        assert_eq!(field_name("colour", "unknown field `colour`, expected ..."), "colour");
        assert_eq!(field_name("items[0].quantity", "invalid type"), "items[0].quantity");
        assert_eq!(field_name(".", "invalid type: sequence"), "body");
    }
}
