//! Errors as the API sends them: a status and `{"error": {"code", "message"}}`,
//! with a message that says what was wrong with the request and nothing of
//! the server's insides (those go to the log).

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use utoipa::ToSchema;

/// An error response.
#[derive(Debug)]
pub struct ApiError {
    /// The response's HTTP status.
    pub status: StatusCode,
    /// Its stable, machine-readable code (`not_found`, `conflict`, …).
    pub code: &'static str,
    /// What was wrong, for a person.
    pub message: String,
}

/// The body of every error response.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// What an error response says.
#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    /// A stable, machine-readable code (`unauthorized`, `not_found`,
    /// `invalid_request`, `payload_too_large`, ...).
    pub code: String,
    /// What was wrong, for a person.
    pub message: String,
}

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    /// A 422: the request is not valid (the message names what is wrong).
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", message)
    }

    /// A 404: no such run, tree or route.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// A failure of the server's own (the store, a task): logged in full, sent
    /// as a 503 without the detail.
    pub fn unavailable(what: &str, detail: impl std::fmt::Display) -> Self {
        tracing::error!(%detail, "{what}");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!("{what}; try again later"),
        )
    }

    /// The store is down for now (its connection was lost, its disk is
    /// full): a 503 that says which, logged at warn.
    pub fn unavailable_now(message: String) -> Self {
        tracing::warn!("{message}");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            message,
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_owned(),
                message: self.message,
            },
        };
        (self.status, axum::Json(body)).into_response()
    }
}

impl From<arbor_supervisor::Error> for ApiError {
    fn from(error: arbor_supervisor::Error) -> Self {
        use arbor_supervisor::Error as E;
        match &error {
            E::UnknownAgent(_)
            | E::UnknownModel { .. }
            | E::InvalidInput { .. }
            | E::InvalidRequest { .. }
            | E::InvalidTreeId(_) => ApiError::invalid(error.to_string()),
            E::UnknownRun(_) | E::UnknownTree(_) | E::NoSuchId(_) => {
                ApiError::not_found(error.to_string())
            }
            E::SteerRefused {
                reason: arbor_actors::steer::SteerRefused::Empty,
                ..
            } => ApiError::invalid(error.to_string()),
            E::SteerRefused {
                reason: arbor_actors::steer::SteerRefused::Full { .. },
                ..
            } => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_messages",
                format!("{error} ([service] max_pending_steers, max_pending_steer_bytes)"),
            ),
            E::UnknownApproval { .. } => ApiError::not_found(error.to_string()),
            E::NothingRaised | E::RaiseRefused(_) => ApiError::invalid(error.to_string()),
            E::DecisionRefused {
                reason: arbor_actors::approval::DecideRefused::InvalidInput(_),
                ..
            } => ApiError::invalid(error.to_string()),
            E::DecisionRefused { .. } => {
                ApiError::new(StatusCode::CONFLICT, "conflict", error.to_string())
            }
            E::SteerRefused { .. } => {
                ApiError::new(StatusCode::CONFLICT, "conflict", error.to_string())
            }
            E::TreeExists(_)
            | E::TreeStored(_)
            | E::NotResumable { .. }
            | E::TurnRunning { .. }
            | E::RaiseEnded { .. }
            | E::CancelRefused { .. } => {
                ApiError::new(StatusCode::CONFLICT, "conflict", error.to_string())
            }
            E::TurnQueueFull { .. } => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_turns",
                format!("{error} ([service] max_queued_turns)"),
            ),
            // Down for now (a lost connection, a full disk): a 503 that says
            // so (the message names no secret: the URL is without its password).
            E::StoreUnavailable { .. } => ApiError::unavailable_now(error.to_string()),
            // The server's own store (or none): a 503, the detail in the log only.
            E::NoStore { .. }
            | E::ReplayWithStore
            | E::StoreIo { .. }
            | E::StoreWrite { .. }
            | E::StoreCorrupt { .. }
            | E::StoreCorruptId { .. }
            | E::StorePoisoned(_)
            | E::Store(_) => ApiError::unavailable("the run store or runtime failed", error),
            _ => ApiError::unavailable("the run store or runtime failed", error),
        }
    }
}

impl From<arbor::Error> for ApiError {
    fn from(error: arbor::Error) -> Self {
        match error {
            arbor::Error::Supervisor(e) => e.into(),
            other => ApiError::unavailable("the service failed", other),
        }
    }
}

/// `axum::Json` whose rejections are API errors: 413 for a body over the
/// limit, 415 without a JSON content type, 422 for bad JSON or a body that
/// does not fit the schema (naming the field).
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

fn json_rejection(rejection: JsonRejection) -> ApiError {
    // The body did not arrive in time (`[service] body_read_timeout`).
    let mut source: Option<&dyn std::error::Error> = Some(&rejection);
    while let Some(error) = source {
        if let Some(timeout) = error.downcast_ref::<super::conn::BodyTimeout>() {
            return ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                timeout.to_string(),
            );
        }
        source = error.source();
    }
    match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            "the request body is larger than the server accepts",
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the body as JSON with Content-Type: application/json",
        ),
        _ => match rejection {
            JsonRejection::JsonDataError(e) => {
                ApiError::invalid(format!("the body does not fit: {}", source_text(&e)))
            }
            JsonRejection::JsonSyntaxError(e) => {
                ApiError::invalid(format!("the body is not valid JSON: {}", source_text(&e)))
            }
            other => ApiError::invalid(other.body_text()),
        },
    }
}

/// The innermost message of a rejection (serde's, with the field and position).
fn source_text(error: &dyn std::error::Error) -> String {
    let mut inner: &dyn std::error::Error = error;
    while let Some(source) = inner.source() {
        inner = source;
    }
    inner.to_string()
}

/// `axum::extract::Query` with API errors.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| ApiQuery(q.0))
            .map_err(|e: QueryRejection| {
                ApiError::invalid(format!("bad query string: {}", source_text(&e)))
            })
    }
}

/// `axum::extract::Path` with API errors.
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| ApiPath(p.0))
            .map_err(|e: PathRejection| ApiError::invalid(format!("bad path: {}", e.body_text())))
    }
}
