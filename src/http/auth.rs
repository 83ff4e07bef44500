//! Authentication: `Authorization: Bearer sk_...` to the account it belongs to.

use std::future::Future;
use std::pin::Pin;

use actix_web::dev::Payload;
use actix_web::http::header::AUTHORIZATION;
use actix_web::{FromRequest, HttpRequest, web};

use super::AppState;
use crate::accounts::{self, Account};
use crate::error::{ApiError, retry_after_secs};

/// The authenticated caller. Every query a handler makes is scoped by `account.id`.
#[derive(Debug, Clone)]
pub struct Authenticated(pub Account);

impl FromRequest for Authenticated {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(request: &HttpRequest, _: &mut Payload) -> Self::Future {
        let state = request.app_data::<web::Data<AppState>>().cloned();
        let token = bearer_token(request).map(str::to_owned);
        Box::pin(async move {
            let state = state.ok_or_else(|| ApiError::Internal(anyhow::anyhow!("no AppState")))?;
            let token = token?;
            let account = accounts::authenticate(&state.accounts, &state.pool, &token)
                .await?
                .ok_or(ApiError::Unauthorized("the API key is not valid"))?;
            state
                .rate_limiter
                .check(account.id)
                .map_err(|wait| ApiError::RateLimited { retry_after_secs: retry_after_secs(wait) })?;
            Ok(Authenticated(account))
        })
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive).
///
/// Two `Authorization` headers are a malformed request, not two chances: 400 `bad-request`
/// (RFC 9110 allows one field; RFC 6750 answers a repeated or doubled credential with 400
/// `invalid_request`). Reading only the first would let a proxy that reads the last disagree
/// with us about who is calling.
fn bearer_token(request: &HttpRequest) -> Result<&str, ApiError> {
    let missing = ApiError::Unauthorized("send your API key as Authorization: Bearer sk_...");
    let mut values = request.headers().get_all(AUTHORIZATION);
    let value = values.next().ok_or(missing)?;
    if values.next().is_some() {
        return Err(ApiError::BadRequest("send one Authorization header, not several"));
    }
    let value = value.to_str().map_err(|_| ApiError::Unauthorized("the API key is not valid"))?;
    match value.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() => {
            Ok(token.trim())
        }
        _ => Err(ApiError::Unauthorized("send your API key as Authorization: Bearer sk_...")),
    }
}
