//! `GET /docs`: openapi.yaml rendered for people by Swagger UI (Apache-2.0, vendored in
//! `assets/swagger-ui/`), served by orderpay itself so that the page works offline and loads
//! nothing from a CDN.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};

use crate::error::ApiError;

const PAGE: &str = include_str!("../../assets/swagger-ui/index.html");
const INIT: &str = include_str!("../../assets/swagger-ui/init.js");
const BUNDLE: &str = include_str!("../../assets/swagger-ui/swagger-ui-bundle.js");
const STYLE: &str = include_str!("../../assets/swagger-ui/swagger-ui.css");

/// `GET /docs`
pub async fn page() -> HttpResponse {
    HttpResponse::Ok().content_type("text/html; charset=utf-8").body(PAGE)
}

/// `GET /docs/{asset}`: the renderer's files.
pub async fn asset(request: HttpRequest, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let (content_type, body) = match name.as_str() {
        "init.js" => ("text/javascript; charset=utf-8", INIT),
        "swagger-ui-bundle.js" => ("text/javascript; charset=utf-8", BUNDLE),
        "swagger-ui.css" => ("text/css; charset=utf-8", STYLE),
        _ => return Err(ApiError::RouteNotFound { path: request.path().to_owned() }),
    };
    Ok(HttpResponse::Ok()
        .content_type(content_type)
        .insert_header((header::CACHE_CONTROL, "public, max-age=3600"))
        .body(body))
}
