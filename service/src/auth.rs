//! Bearer tokens: every API route but the health checks (and the static page,
//! which holds no data) needs `Authorization: Bearer <token>`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::Shared;
use super::access::Principal;
use super::error::ApiError;

/// The tokens a request may carry, each naming its [`Principal`]. Compared
/// in constant time: every token is compared in full, whatever matched
/// before, so the timing tells nothing of how much of a guess was right
/// (only, as with any bearer scheme, that the lengths differ).
#[derive(Default)]
pub struct Tokens(Vec<(Box<[u8]>, Principal)>);

impl Tokens {
    /// These tokens (trimmed; empty ones dropped), each an unnamed admin.
    pub fn new<S: AsRef<str>>(tokens: impl IntoIterator<Item = S>) -> Tokens {
        let mut out = Tokens::default();
        out.add(tokens, &Principal::admin());
        out
    }

    /// Tokens from a comma-separated list (an environment variable's
    /// value), each an unnamed admin.
    pub fn parse(list: &str) -> Tokens {
        Tokens::new(list.split(','))
    }

    /// Adds tokens (trimmed; empty ones dropped) for `principal`.
    pub fn add<S: AsRef<str>>(
        &mut self,
        tokens: impl IntoIterator<Item = S>,
        principal: &Principal,
    ) {
        self.0.extend(
            tokens
                .into_iter()
                .map(|t| t.as_ref().trim().as_bytes().to_vec())
                .filter(|t| !t.is_empty())
                .map(|t| (t.into_boxed_slice(), principal.clone())),
        );
    }

    /// Whether there is no token (the service then refuses a public address).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many tokens there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether `presented` is one of the tokens (compared in constant time).
    pub fn accepts(&self, presented: &[u8]) -> bool {
        self.find(presented).is_some()
    }

    /// The principal whose token `presented` is: every token compared in
    /// full (constant time), the first match taken.
    pub fn find(&self, presented: &[u8]) -> Option<&Principal> {
        use subtle::ConditionallySelectable as _;
        let mut index = 0u64;
        let mut any = subtle::Choice::from(0);
        // Backwards, so that the first match is the last one assigned.
        for (i, (token, _)) in self.0.iter().enumerate().rev() {
            let hit = token.as_ref().ct_eq(presented);
            index.conditional_assign(&(i as u64), hit);
            any |= hit;
        }
        bool::from(any).then(|| &self.0[index as usize].1)
    }

    /// Two tokens that are the same but name different principals: the
    /// names of such a pair (a token must name one caller).
    pub fn ambiguous(&self) -> Option<(String, String)> {
        let name = |p: &Principal| p.name.as_deref().unwrap_or("(tokens_env)").to_owned();
        for (i, (a, pa)) in self.0.iter().enumerate() {
            for (b, pb) in &self.0[i + 1..] {
                if a == b && pa != pb {
                    return Some((name(pa), name(pb)));
                }
            }
        }
        None
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
    let principal = presented.and_then(|token| shared.options.tokens.find(token.as_bytes()));
    let message = match (presented, principal) {
        (Some(_), Some(principal)) => {
            let principal = principal.clone();
            let mut request = request;
            request.extensions_mut().insert(principal);
            return next.run(request).await;
        }
        (Some(_), None) => "the bearer token is not valid",
        (None, _) => "send an API token: Authorization: Bearer <token>",
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

    /// Each token finds its own principal, the unnamed ones admins; a
    /// token two principals share is found out.
    #[test]
    fn a_token_names_its_principal() {
        use super::super::access::{Principal, Role};
        let mut tokens = Tokens::parse("root");
        let alice = Principal::named("alice", Role::User);
        let audit = Principal::named("audit", Role::Read);
        tokens.add(["a1", " a2 "], &alice);
        tokens.add("r1,".split(','), &audit);
        assert_eq!(tokens.find(b"root"), Some(&Principal::admin()));
        assert_eq!(tokens.find(b"a1"), Some(&alice));
        assert_eq!(tokens.find(b"a2"), Some(&alice));
        assert_eq!(tokens.find(b"r1"), Some(&audit));
        assert_eq!(tokens.find(b"a"), None);
        assert_eq!(tokens.find(b""), None);
        assert_eq!(tokens.ambiguous(), None);
        tokens.add(["a1"], &audit);
        assert_eq!(
            tokens.ambiguous(),
            Some(("alice".to_owned(), "audit".to_owned()))
        );
        // The same token twice for one principal is no ambiguity.
        let mut twice = Tokens::parse("x,x");
        twice.add(["y", "y"], &alice);
        assert_eq!(twice.ambiguous(), None);
    }
}
