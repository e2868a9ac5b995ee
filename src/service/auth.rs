//! Bearer tokens: every API route but the health checks (and the static page,
//! which holds no data) needs `Authorization: Bearer <token>`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::Shared;
use super::error::ApiError;

/// The tokens a request may carry. Compared in constant time: every token is
/// compared in full, whatever matched before, so the timing tells nothing of
/// how much of a guess was right (only, as with any bearer scheme, that the
/// lengths differ).
#[derive(Default)]
pub struct Tokens(Vec<Box<[u8]>>);

impl Tokens {
    /// These tokens (trimmed; empty ones dropped).
    pub fn new<S: AsRef<str>>(tokens: impl IntoIterator<Item = S>) -> Tokens {
        Tokens(
            tokens
                .into_iter()
                .map(|t| t.as_ref().trim().as_bytes().to_vec())
                .filter(|t| !t.is_empty())
                .map(Vec::into_boxed_slice)
                .collect(),
        )
    }

    /// Tokens from a comma-separated list (an environment variable's value).
    pub fn parse(list: &str) -> Tokens {
        Tokens::new(list.split(','))
    }

    /// Whether there is no token (the service then refuses a public address).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `presented` is one of the tokens (compared in constant time).
    pub fn accepts(&self, presented: &[u8]) -> bool {
        let mut ok = subtle::Choice::from(0);
        for token in &self.0 {
            ok |= token.as_ref().ct_eq(presented);
        }
        ok.into()
    }
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} redacted)", self.0.len())
    }
}

pub async fn require_token(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        // The scheme is case-insensitive (RFC 7235).
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    let message = match presented {
        Some(token) if shared.options.tokens.accepts(token.as_bytes()) => {
            return next.run(request).await;
        }
        Some(_) => "the bearer token is not valid",
        None => "send an API token: Authorization: Bearer <token>",
    };
    let mut response =
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"arbor\""),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::Tokens;

    #[test]
    fn only_a_configured_token_is_accepted() {
        let tokens = Tokens::parse(" alpha, beta ,,");
        assert!(tokens.accepts(b"alpha"));
        assert!(tokens.accepts(b"beta"));
        assert!(!tokens.accepts(b"alph"));
        assert!(!tokens.accepts(b"alphaa"));
        assert!(!tokens.accepts(b""));
        assert!(!Tokens::parse("").accepts(b""));
        assert!(Tokens::parse(" , ").is_empty());
        assert_eq!(format!("{tokens:?}"), "Tokens(2 redacted)");
    }
}
