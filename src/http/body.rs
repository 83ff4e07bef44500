//! JSON request bodies: media type, size limit, time limit and well-formedness, checked before
//! any domain code runs, each with its own problem type.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use actix_web::body::{BodySize, BodyStream, BoxBody, EitherBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::header::CONTENT_TYPE;
use actix_web::middleware::Next;
use actix_web::web::Bytes;
use actix_web::{FromRequest, HttpMessage, HttpRequest};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{ApiError, FieldError};

/// The largest request body accepted: 1 MiB.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// How long a client may take to send its request body, counted from the moment its request
/// head was read (`ORDERPAY_CLIENT_BODY_TIMEOUT_MS`). App data, read by [`body_deadline`].
#[derive(Debug, Clone, Copy)]
pub struct BodyTimeout(pub Duration);

/// Without [`BodyTimeout`] in the app data.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_millis(10_000);

/// Bounds the time a request body may take, for every request, and makes sure that a connection
/// is never held by a body nobody reads.
///
/// actix-http bounds the request head (`client_request_timeout`) but not the body: a client that
/// sends its head and part of a body, then stalls, would hold the connection and the handler
/// waiting for it for ever. So the body gets a deadline, counted from now (the head has just
/// been read), which [`JsonBody`] enforces: 408 `request-timeout`, sent with `Connection: close`.
///
/// A body the handler does not read (an early 401, a route without a body) is the other half.
/// When the application has dropped an unfinished chunked request body by the time the response
/// is sent, actix-http keeps the connection to read and discard the rest of it, with no time
/// limit; while the application still holds it, actix-http closes the connection after the
/// response instead (after the `client_disconnect_timeout` linger). So the payload moves from the
/// request into a shared [`RequestBody`], and the response body holds it until actix has sent
/// the last byte: an unfinished request body always ends the connection, in bounded time.
pub async fn body_deadline(
    mut request: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody, HoldingBody>>, actix_web::Error> {
    let payload = request.take_payload();
    if matches!(payload, Payload::None) {
        return Ok(next.call(request).await?.map_into_left_body());
    }
    let timeout = request.app_data::<BodyTimeout>().map_or(DEFAULT_BODY_TIMEOUT, |limit| limit.0);
    let body = RequestBody::new(payload, timeout);
    request.extensions_mut().insert(body.clone());
    let response = next.call(request).await?;
    Ok(response.map_body(|_, response_body| {
        EitherBody::right(HoldingBody { body: response_body.boxed(), _request_body: body.payload })
    }))
}

/// A response body that keeps the request's payload alive until the response is sent (see
/// [`body_deadline`]).
pub struct HoldingBody {
    body: BoxBody,
    _request_body: Rc<RefCell<Payload>>,
}

impl MessageBody for HoldingBody {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Bytes, Self::Error>>> {
        Pin::new(&mut self.body).poll_next(cx)
    }
}

/// A request's payload and the deadline for reading it, shared by the request (for
/// [`JsonBody`]) and, once answered, its response (see [`body_deadline`]).
#[derive(Clone)]
struct RequestBody {
    payload: Rc<RefCell<Payload>>,
    deadline: tokio::time::Instant,
    timeout: Duration,
}

impl RequestBody {
    fn new(payload: Payload, timeout: Duration) -> Self {
        RequestBody {
            payload: Rc::new(RefCell::new(payload)),
            deadline: tokio::time::Instant::now() + timeout,
            timeout,
        }
    }

    /// The payload, for reading; it goes back when the reader is done or dropped.
    fn take(&self) -> TakenPayload {
        TakenPayload { payload: self.payload.borrow_mut().take(), home: self.payload.clone() }
    }
}

/// A payload out of its [`RequestBody`] while it is read. Back home on drop, so that a read that
/// times out or is abandoned (another extractor failed) leaves the payload held, not dropped.
struct TakenPayload {
    payload: Payload,
    home: Rc<RefCell<Payload>>,
}

impl Drop for TakenPayload {
    fn drop(&mut self) {
        *self.home.borrow_mut() = self.payload.take();
    }
}

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
    let body = UnreadBody::of(request, payload);
    async move {
        let bytes = body.read().await?;
        if bytes.is_empty() {
            return Ok(None);
        }
        if !content_type.as_deref().is_some_and(is_json_media_type) {
            return Err(ApiError::UnsupportedMediaType);
        }
        parse_json(&bytes).map(Some)
    }
}

/// Parses a JSON document, refusing one in which an object names a member twice (400
/// `malformed-json`, the detail naming the member's path): serde_json keeps the last copy, so
/// `{"unit_price":"1.50","unit_price":"9.00"}` would be read as 9.00 while a proxy, a log or the
/// client's own code may have read 1.50. Numbers stay their exact text (`arbitrary_precision`).
pub fn parse_json(bytes: &[u8]) -> Result<Value, ApiError> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|error| ApiError::MalformedJson(error.to_string()))?;
    let repeated = std::cell::RefCell::new(None);
    let mut reader = serde_json::Deserializer::from_slice(bytes);
    if serde::de::DeserializeSeed::deserialize(
        Members { path: String::new(), repeated: &repeated },
        &mut reader,
    )
    .is_err()
    {
        let detail = match repeated.into_inner() {
            Some(path) => format!("the member {path} appears more than once"),
            // The document parsed once already: only a repeated member makes the check fail.
            None => "the body is not a JSON document".to_owned(),
        };
        return Err(ApiError::MalformedJson(detail));
    }
    Ok(value)
}

/// The check of [`parse_json`]: walks a JSON value, fails at the first object that names a
/// member twice and leaves that member's path (`items[0].unit_price`) in `repeated`. It builds
/// nothing; serde_json bounds its depth as for any document.
struct Members<'a> {
    path: String,
    repeated: &'a std::cell::RefCell<Option<String>>,
}

impl Members<'_> {
    fn below(&self, step: &str) -> Self {
        Members { path: format!("{}{step}", self.path), repeated: self.repeated }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Members<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Members<'_> {
    type Value = ();

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut items: A) -> Result<(), A::Error> {
        let mut index = 0_usize;
        while items.next_element_seed(self.below(&format!("[{index}]")))?.is_some() {
            index += 1;
        }
        Ok(())
    }

    /// An object (with `arbitrary_precision`, a number arrives here too, as a one-member map).
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut members: A) -> Result<(), A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(name) = members.next_key::<String>()? {
            let path = if self.path.is_empty() { name.clone() } else { format!("{}.{name}", self.path) };
            if !seen.insert(name) {
                *self.repeated.borrow_mut() = Some(path);
                return Err(serde::de::Error::custom("a member appears more than once"));
            }
            members.next_value_seed(Members { path, repeated: self.repeated })?;
        }
        Ok(())
    }
}

/// A request body not read yet: [`UnreadBody::read`] reads it whole, as sent, under the same
/// bounds as every body (at most [`MAX_BODY_BYTES`], within the body deadline). For a handler
/// that checks something cheaper before it reads anything (a webhook's signature headers) and
/// needs the exact bytes (the signature covers them, not their JSON).
pub struct UnreadBody {
    declared_length: Option<u64>,
    body: RequestBody,
}

impl UnreadBody {
    fn of(request: &HttpRequest, payload: &mut Payload) -> UnreadBody {
        let declared_length = request
            .headers()
            .get(actix_web::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        // The body as `body_deadline` set it aside; without that middleware, the request's own.
        let body = request.extensions().get::<RequestBody>().cloned().unwrap_or_else(|| {
            let timeout = request.app_data::<BodyTimeout>().map_or(DEFAULT_BODY_TIMEOUT, |limit| limit.0);
            RequestBody::new(payload.take(), timeout)
        });
        UnreadBody { declared_length, body }
    }

    /// The body's bytes: 413 over the limit (refused by its `Content-Length` before reading),
    /// 408 when it does not arrive in time.
    pub async fn read(self) -> Result<Bytes, ApiError> {
        let UnreadBody { declared_length, body } = self;
        if declared_length.is_some_and(|length| length > MAX_BODY_BYTES as u64) {
            return Err(ApiError::PayloadTooLarge { limit: MAX_BODY_BYTES });
        }
        let mut taken = body.take();
        let read = actix_web::body::to_bytes_limited(BodyStream::new(&mut taken.payload), MAX_BODY_BYTES);
        match tokio::time::timeout_at(body.deadline, read).await {
            Err(_elapsed) => Err(ApiError::RequestTimeout(body.timeout)),
            Ok(Err(_limit_exceeded)) => Err(ApiError::PayloadTooLarge { limit: MAX_BODY_BYTES }),
            Ok(Ok(Err(error))) => Err(ApiError::MalformedJson(format!("unreadable body: {error}"))),
            Ok(Ok(Ok(bytes))) => Ok(bytes),
        }
    }
}

impl FromRequest for UnreadBody {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(request: &HttpRequest, payload: &mut Payload) -> Self::Future {
        std::future::ready(Ok(UnreadBody::of(request, payload)))
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
    fn a_member_named_twice_is_refused_with_its_path_wherever_it_is() {
        let refused = |text: &str| match parse_json(text.as_bytes()) {
            Err(ApiError::MalformedJson(detail)) => detail,
            other => panic!("{text}: {other:?}"),
        };
        assert_eq!(
            refused(r#"{"unit_price":"1.50","unit_price":"9.00"}"#),
            "the member unit_price appears more than once"
        );
        assert_eq!(
            refused(r#"{"items":[{"sku":"a"},{"sku":"b","quantity":1,"quantity":2}]}"#),
            "the member items[1].quantity appears more than once"
        );
        assert_eq!(
            refused(r#"[{"a":{"b":[1,{"c":null,"c":true}]}}]"#),
            "the member [0].a.b[1].c appears more than once"
        );
        assert!(refused("{").starts_with("EOF while parsing"), "{}", refused("{"));
        // The same name in different objects, and numbers kept as written.
        let value = parse_json(br#"{"a":{"x":1},"b":{"x":2.500},"c":[{"x":1},{"x":19.990}]}"#).unwrap();
        assert_eq!(value["b"]["x"].to_string(), "2.500");
        assert_eq!(value["c"][1]["x"].to_string(), "19.990");
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
