//! Who may do what: each request's caller is a [`Principal`] (a named one
//! from `[service.principals.NAME]`, or an unnamed admin: a token of
//! `[service] tokens_env`, or anyone when the service has no tokens), and
//! [`decide`] says whether it may do an [`Action`] on a tree started by
//! another (or the same) principal. It is the one place that decides:
//! handlers read the tree's owner from the store (so every replica answers
//! alike) and do what it says.

use std::sync::Arc;

use arbor_actors::{RunId, TreeId};
use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;

pub use arbor::config::Role;

use super::Shared;
use super::error::ApiError;

/// The caller of a request, as its token names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// Its `[service.principals.NAME]` name; `None` for an unnamed admin.
    pub name: Option<Arc<str>>,
    /// What it may do.
    pub role: Role,
}

impl Principal {
    /// An unnamed admin: a token of `[service] tokens_env` (as every token
    /// was before principals), or any caller of a service without tokens.
    pub fn admin() -> Principal {
        Principal {
            name: None,
            role: Role::Admin,
        }
    }

    /// A named principal.
    pub fn named(name: &str, role: Role) -> Principal {
        Principal {
            name: Some(Arc::from(name)),
            role,
        }
    }

    /// What the trees it starts are stored with (`None`: no owner).
    pub fn owner_name(&self) -> Option<String> {
        self.name.as_deref().map(str::to_owned)
    }
}

/// What a request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Starts a new tree (`POST /v1/runs`): it is the caller's.
    Start,
    /// Reads a tree: lists it, its spawn tree, a run's state, its events,
    /// its waiting approvals.
    Read,
    /// Changes a tree: cancels a run, steers one, decides an approval,
    /// raises its budget, starts a follow-up turn.
    Write,
    /// Reads the server's own figures (`/metrics`), which count every tree.
    Operate,
}

/// What [`decide`] answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Go on.
    Allow,
    /// 404, exactly as for a tree that does not exist: whether another
    /// principal's tree exists is not told.
    Hidden,
    /// 403: the caller sees the tree (or the route) but may not do this.
    Forbidden,
}

/// Whether `caller` may do `action` on a tree `owner` started (`None`: a
/// tree no named principal started; ignored for `Start` and `Operate`).
///
/// - `admin`: everything, on every tree.
/// - `user`: starts trees; reads and changes only the trees it started;
///   every other tree is hidden (404); no metrics (403).
/// - `read`: reads every tree and the metrics; starts and changes nothing
///   (403).
pub fn decide(caller: &Principal, action: Action, owner: Option<&str>) -> Verdict {
    match (caller.role, action) {
        (Role::Admin, _) => Verdict::Allow,
        (Role::Read, Action::Read | Action::Operate) => Verdict::Allow,
        (Role::Read, Action::Start | Action::Write) => Verdict::Forbidden,
        (Role::User, Action::Start) => Verdict::Allow,
        (Role::User, Action::Operate) => Verdict::Forbidden,
        (Role::User, Action::Read | Action::Write) => match (caller.name.as_deref(), owner) {
            (Some(name), Some(owner)) if name == owner => Verdict::Allow,
            _ => Verdict::Hidden,
        },
    }
}

/// Which trees a listing shows `caller`: every tree, or those one principal
/// started. (The same rule as [`decide`]'s `Read`, as a store's filter.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every tree.
    All,
    /// The trees this principal started.
    Owner(Arc<str>),
    /// None (a user without a name, which the config never makes).
    Nothing,
}

/// The trees `caller` sees in a listing.
pub fn scope(caller: &Principal) -> Scope {
    match (caller.role, &caller.name) {
        (Role::Admin | Role::Read, _) => Scope::All,
        (Role::User, Some(name)) => Scope::Owner(name.clone()),
        (Role::User, None) => Scope::Nothing,
    }
}

/// What the action needs to know of the tree's owner: whether the store
/// must be asked at all (an admin or a `read` caller's verdict does not
/// depend on it, so their requests cost no extra read).
pub fn needs_owner(caller: &Principal, action: Action) -> bool {
    caller.role == Role::User && matches!(action, Action::Read | Action::Write)
}

/// The request's caller, as the token check found it. A service without
/// tokens has no check: its callers are unnamed admins (loopback only).
pub(crate) struct Caller(pub Principal);

impl FromRequestParts<Arc<Shared>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        shared: &Arc<Shared>,
    ) -> Result<Self, Self::Rejection> {
        match parts.extensions.get::<Principal>() {
            Some(principal) => Ok(Caller(principal.clone())),
            None if shared.options.tokens.is_empty() => Ok(Caller(Principal::admin())),
            // Never without the token check's layer: refused all the same.
            None => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "send an API token: Authorization: Bearer <token>",
            )),
        }
    }
}

/// The 403 of a `Forbidden` verdict.
pub(crate) fn forbidden(caller: &Principal, action: Action) -> ApiError {
    let what = match action {
        Action::Start => "start trees",
        Action::Read => "read this",
        Action::Write => "change trees",
        Action::Operate => "read the server's metrics",
    };
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!(
            "this token's principal ({}) has role {} and may not {what}",
            caller.name.as_deref().unwrap_or("unnamed"),
            caller.role.as_str()
        ),
    )
}

/// What a request acts on, for [`check`]: its 404 names it as a request
/// for a missing one would.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Subject<'a> {
    /// No tree (a start, the metrics).
    Service,
    /// A tree, by id.
    Tree(&'a TreeId),
    /// A run (of the tree its id names).
    Run(&'a RunId),
}

impl Subject<'_> {
    fn tree_id(&self) -> Option<&TreeId> {
        match self {
            Subject::Service => None,
            Subject::Tree(tree) => Some(tree),
            Subject::Run(run) => Some(run.tree()),
        }
    }

    /// The 404 a missing tree or run gets.
    fn missing(&self) -> ApiError {
        use arbor_supervisor::Error;
        match self {
            Subject::Run(run) => Error::UnknownRun((*run).clone()).into(),
            Subject::Tree(tree) => Error::UnknownTree((*tree).clone()).into(),
            Subject::Service => ApiError::not_found("no such route"),
        }
    }
}

/// Whether `caller` may do `action` on `subject` ([`decide`]), the tree's
/// owner read from the store when the verdict depends on it (never from
/// this process's memory: every replica answers alike). A tree the store
/// does not have, and one `decide` hides, both get the 404 of a missing one.
pub(crate) async fn check(
    shared: &Shared,
    caller: &Principal,
    action: Action,
    subject: Subject<'_>,
) -> Result<(), ApiError> {
    let owner = match subject.tree_id() {
        Some(tree) if needs_owner(caller, action) => {
            let tree = tree.clone();
            let read = shared
                .runtime
                .supervisor()
                .read_store(move |store| store.principal(&tree))
                .await;
            match read {
                Ok(owner) => owner,
                Err(arbor_supervisor::Error::UnknownTree(_)) => return Err(subject.missing()),
                Err(error) => return Err(error.into()),
            }
        }
        _ => None,
    };
    match decide(caller, action, owner.as_deref()) {
        Verdict::Allow => Ok(()),
        Verdict::Hidden => Err(subject.missing()),
        Verdict::Forbidden => Err(forbidden(caller, action)),
    }
}

/// Of `items`, those of trees `caller` may read (`tree` gives an item's
/// tree), the owners read from the store, once per tree.
pub(crate) async fn readable<T: Send + 'static>(
    shared: &Shared,
    caller: &Principal,
    items: Vec<T>,
    tree: impl Fn(&T) -> &TreeId,
) -> Result<Vec<T>, ApiError> {
    if !needs_owner(caller, Action::Read) {
        return match decide(caller, Action::Read, None) {
            Verdict::Allow => Ok(items),
            _ => Ok(Vec::new()),
        };
    }
    let mut trees: Vec<TreeId> = items.iter().map(|i| tree(i).clone()).collect();
    trees.sort();
    trees.dedup();
    let owners = shared
        .runtime
        .supervisor()
        .read_store(move |store| {
            let mut owners = std::collections::HashMap::new();
            for tree in trees {
                match store.principal(&tree) {
                    Ok(owner) => {
                        owners.insert(tree, owner);
                    }
                    // Gone meanwhile: nobody's.
                    Err(arbor_supervisor::Error::UnknownTree(_)) => {}
                    Err(error) => return Err(error),
                }
            }
            Ok(owners)
        })
        .await?;
    Ok(items
        .into_iter()
        .filter(|item| {
            let owner = owners.get(tree(item)).and_then(|o| o.as_deref());
            decide(caller, Action::Read, owner) == Verdict::Allow
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every role against every action, on the caller's own tree, another
    /// principal's, and one no principal started.
    #[test]
    fn each_role_may_do_what_its_table_says_on_whose_tree() {
        use Action::*;
        use Verdict::*;
        let admin = Principal::admin();
        let named_admin = Principal::named("root", Role::Admin);
        let alice = Principal::named("alice", Role::User);
        let auditor = Principal::named("auditor", Role::Read);
        let nameless_user = Principal {
            name: None,
            role: Role::User,
        };
        // (caller, action, owner, verdict)
        let table: &[(&Principal, Action, Option<&str>, Verdict)] = &[
            (&admin, Start, None, Allow),
            (&admin, Read, Some("alice"), Allow),
            (&admin, Write, Some("alice"), Allow),
            (&admin, Read, None, Allow),
            (&admin, Write, None, Allow),
            (&admin, Operate, None, Allow),
            (&named_admin, Write, Some("bob"), Allow),
            (&named_admin, Read, None, Allow),
            (&alice, Start, None, Allow),
            (&alice, Read, Some("alice"), Allow),
            (&alice, Write, Some("alice"), Allow),
            (&alice, Read, Some("bob"), Hidden),
            (&alice, Write, Some("bob"), Hidden),
            (&alice, Read, None, Hidden),
            (&alice, Write, None, Hidden),
            // A name is not a prefix match.
            (&alice, Read, Some("alice2"), Hidden),
            (&alice, Read, Some("alic"), Hidden),
            (&alice, Operate, None, Forbidden),
            (&auditor, Start, None, Forbidden),
            (&auditor, Read, Some("alice"), Allow),
            (&auditor, Read, None, Allow),
            (&auditor, Write, Some("alice"), Forbidden),
            (&auditor, Write, Some("auditor"), Forbidden),
            (&auditor, Operate, None, Allow),
            (&nameless_user, Read, None, Hidden),
            (&nameless_user, Write, None, Hidden),
        ];
        for (caller, action, owner, verdict) in table {
            assert_eq!(
                decide(caller, *action, *owner),
                *verdict,
                "{caller:?} {action:?} on {owner:?}"
            );
            // The store is asked exactly when the owner matters.
            let differs = [None, Some("alice"), Some("bob")]
                .iter()
                .any(|o| decide(caller, *action, *o) != decide(caller, *action, *owner));
            assert!(
                !differs || needs_owner(caller, *action),
                "{caller:?} {action:?}: the owner matters but is not read"
            );
        }
        assert_eq!(scope(&admin), Scope::All);
        assert_eq!(scope(&auditor), Scope::All);
        assert_eq!(scope(&alice), Scope::Owner(Arc::from("alice")));
        assert_eq!(scope(&nameless_user), Scope::Nothing);
    }
}
