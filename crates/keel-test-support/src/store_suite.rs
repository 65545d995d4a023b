//! Conformance checks for any [`Store`] backend.
//!
//! Every check creates its own tenants, sessions and runs with fresh ids and
//! never assumes an empty database, so the suite can run against a shared
//! PostgreSQL instance as well as a fresh SQLite file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use keel_protocol::{
    ApprovalRecord, ApprovalStatus, Commit, ErrorBody, Event, EventKind, Message, NewRun,
    Principal, QuotaKey, QuotaLimit, RunFilter, RunPatch, RunRecord, RunStatus, Store, StoreError,
    ToolCall, Usage, new_id,
};

/// Runs every check of this module, one after the other.
pub async fn run_all(store: Arc<dyn Store>) {
    ping(&store).await;
    create_and_get(&store).await;
    duplicate_run_id_is_refused(&store).await;
    idempotency(&store).await;
    tenant_isolation(&store).await;
    commit_numbers_events(&store).await;
    commit_to_unknown_run_is_not_found(&store).await;
    concurrent_commits_are_gap_free(&store, 20).await;
    patch_semantics(&store).await;
    history_order(&store).await;
    call_records_append_and_read_back(&store).await;
    session_messages(&store).await;
    archive_session(&store).await;
    list_filters_and_pagination(&store).await;
    list_page_sizes(&store).await;
    unfinished_runs(&store).await;
    approvals(&store).await;
    approval_commit_is_atomic(&store).await;
    concurrent_deciders_one_wins(&store, 10).await;
    inbound_messages_count_once(&store, 10).await;
    quota_takes_never_pass_the_limit(&store, 20).await;
    run_slots_are_given_back_when_runs_end(&store, 8).await;
}

pub fn principal(tenant: &str) -> Principal {
    Principal {
        tenant: tenant.to_owned(),
        id: format!("user-of-{tenant}"),
        roles: vec!["operator".into()],
    }
}

pub fn new_run(tenant: &str, session: &str) -> NewRun {
    NewRun {
        id: new_id("run"),
        principal: principal(tenant),
        session: session.to_owned(),
        agent: "assistant".into(),
        input: "what is the weather?".into(),
        idempotency_key: None,
        metadata: json!({"source": "suite", "n": 1}),
    }
}

/// Creates a run that must be new.
pub async fn create(store: &Arc<dyn Store>, tenant: &str, session: &str) -> RunRecord {
    let (run, created) = store.create_run(new_run(tenant, session)).await.unwrap();
    assert!(created, "a run with a fresh id and no key must be created");
    run
}

fn delta(text: &str) -> EventKind {
    EventKind::MessageDelta { text: text.into() }
}

fn messages_only(messages: Vec<Message>) -> Commit {
    Commit {
        messages,
        ..Commit::default()
    }
}

/// Messages with the event a turn writes beside them: a backend may keep a
/// commit's messages apart when it has events and when it has none, and
/// either way they read back in the order they were written.
fn turn_with(messages: Vec<Message>) -> Commit {
    Commit {
        events: vec![delta("turn")],
        messages,
        ..Commit::default()
    }
}

fn patch_only(patch: RunPatch) -> Commit {
    Commit {
        approvals: Vec::new(),
        patch: Some(patch),
        ..Commit::default()
    }
}

async fn set_status(store: &Arc<dyn Store>, run_id: &str, status: RunStatus) {
    let patch = RunPatch {
        status: Some(status),
        ..RunPatch::default()
    };
    store.commit(run_id, patch_only(patch)).await.unwrap();
}

fn ids(runs: &[RunRecord]) -> Vec<String> {
    runs.iter().map(|r| r.id.clone()).collect()
}

fn ids_of(runs: &[&RunRecord]) -> Vec<String> {
    runs.iter().map(|r| r.id.clone()).collect()
}

fn filter(session: Option<&str>, status: Option<RunStatus>, limit: u32) -> RunFilter {
    RunFilter {
        session: session.map(str::to_owned),
        agent: None,
        status,
        limit,
        cursor: None,
    }
}

/// Follows cursors to the end, checking that every page but the last is full.
async fn all_pages(store: &Arc<dyn Store>, tenant: &str, mut f: RunFilter) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    loop {
        let page = store.list_runs(tenant, &f).await.unwrap();
        pages.push(ids(&page.runs));
        match page.next_cursor {
            Some(cursor) => {
                assert_eq!(
                    page.runs.len(),
                    f.limit as usize,
                    "a page before the last is full"
                );
                f.cursor = Some(cursor);
            }
            None => break,
        }
        assert!(pages.len() < 1000, "pagination does not terminate");
    }
    pages
}

/// Call records are appended by commits, with the rest of the commit or
/// not at all, and read back newest last, per run.
pub async fn call_records_append_and_read_back(store: &Arc<dyn Store>) {
    let tenant = new_id("ten");
    let run = create(store, &tenant, "s").await;
    let other = create(store, &tenant, "s").await;
    let call = |n: u64| keel_protocol::StoredCall {
        n,
        record: format!(r#"{{"tool":"t","call":"c{n}","kind":"ok"}}"#),
    };
    assert!(store.call_records(&run.id, 10).await.unwrap().is_empty());
    for batch in [
        vec![call(1)],
        vec![call(2), call(3)],
        Vec::new(),
        vec![call(4)],
    ] {
        let commit = Commit {
            events: vec![delta("turn")],
            calls: batch,
            ..Commit::default()
        };
        store.commit(&run.id, commit).await.unwrap();
    }
    store
        .commit(
            &other.id,
            Commit {
                calls: vec![call(1)],
                ..Commit::default()
            },
        )
        .await
        .unwrap();
    let all = store.call_records(&run.id, 10).await.unwrap();
    assert_eq!(all, (1..=4).map(call).collect::<Vec<_>>());
    let last = store.call_records(&run.id, 2).await.unwrap();
    assert_eq!(last, vec![call(3), call(4)]);
    assert_eq!(
        store.call_records(&other.id, 10).await.unwrap(),
        vec![call(1)]
    );
    // A place taken twice fails the whole commit: its events are not written.
    let before = store.events_after(&run.id, 0, 100).await.unwrap().len();
    let again = Commit {
        events: vec![delta("again")],
        calls: vec![call(5), call(4)],
        ..Commit::default()
    };
    assert!(store.commit(&run.id, again).await.is_err());
    assert_eq!(
        store.events_after(&run.id, 0, 100).await.unwrap().len(),
        before
    );
    assert_eq!(store.call_records(&run.id, 10).await.unwrap().len(), 4);
}

pub async fn ping(store: &Arc<dyn Store>) {
    store.ping().await.unwrap();
}

pub async fn create_and_get(store: &Arc<dyn Store>) {
    let tenant = new_id("ten");
    let session = new_id("ses");
    let request = new_run(&tenant, &session);
    let before = keel_protocol::now();
    let (run, created) = store.create_run(request.clone()).await.unwrap();
    let after = keel_protocol::now();
    assert!(created);
    assert_eq!(run.id, request.id);
    assert_eq!(run.tenant, tenant);
    assert_eq!(run.session, session);
    assert_eq!(run.agent, request.agent);
    assert_eq!(run.input, request.input);
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!(run.output, None);
    assert_eq!(run.pending, None);
    assert_eq!(run.steps, 0);
    assert_eq!(run.usage, Usage::default());
    assert_eq!(run.error, None);
    assert_eq!(run.metadata, request.metadata);
    assert_eq!(run.principal, Some(request.principal.clone()));
    assert_eq!(run.last_seq, 0);
    assert!(run.created_at >= before && run.created_at <= after);
    assert_eq!(run.created_at, run.updated_at);

    let stored = store.get_run(&tenant, &run.id).await.unwrap();
    assert_eq!(
        stored.as_ref(),
        Some(&run),
        "get_run returns the run as created"
    );
    let stored = stored.unwrap();
    assert_eq!(
        stored.principal,
        Some(request.principal),
        "the principal survives storage"
    );
    assert_eq!(stored.state, run.state);

    assert!(
        store
            .get_run(&tenant, &new_id("run"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .get_run(&new_id("ten"), &run.id)
            .await
            .unwrap()
            .is_none()
    );
    // A run without metadata keeps none.
    let mut bare = new_run(&tenant, &session);
    bare.metadata = Value::Null;
    let (bare, _) = store.create_run(bare).await.unwrap();
    let stored = store.get_run(&tenant, &bare.id).await.unwrap().unwrap();
    assert_eq!(stored.metadata, Value::Null);
}

pub async fn duplicate_run_id_is_refused(store: &Arc<dyn Store>) {
    let tenant = new_id("ten");
    let first = create(store, &tenant, "s").await;
    let mut again = new_run(&tenant, "s");
    again.id = first.id.clone();
    again.input = "other input".into();
    let err = store.create_run(again.clone()).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "got {err:?}");
    // Ids are global: another tenant cannot take it either.
    again.principal = principal(&new_id("ten"));
    assert!(store.create_run(again).await.is_err());
    let stored = store.get_run(&tenant, &first.id).await.unwrap().unwrap();
    assert_eq!(stored, first, "a refused create leaves the run unchanged");
}

pub async fn idempotency(store: &Arc<dyn Store>) {
    let tenant = new_id("ten");
    let key = new_id("key");
    let mut request = new_run(&tenant, "s");
    request.idempotency_key = Some(key.clone());
    let (first, created) = store.create_run(request).await.unwrap();
    assert!(created);

    // The key wins over a new id and different content.
    let mut repeat = new_run(&tenant, "other-session");
    repeat.idempotency_key = Some(key.clone());
    repeat.input = "different".into();
    let (again, created) = store.create_run(repeat.clone()).await.unwrap();
    assert!(!created, "a reused key must not create a run");
    assert_eq!(again, first);
    assert!(store.get_run(&tenant, &repeat.id).await.unwrap().is_none());

    // The existing run is returned as it stands now.
    set_status(store, &first.id, RunStatus::Running).await;
    repeat.id = new_id("run");
    let (again, created) = store.create_run(repeat).await.unwrap();
    assert!(!created);
    assert_eq!(again.id, first.id);
    assert_eq!(again.status, RunStatus::Running);

    // Keys are per tenant.
    let other_tenant = new_id("ten");
    let mut foreign = new_run(&other_tenant, "s");
    foreign.idempotency_key = Some(key.clone());
    let (foreign_run, created) = store.create_run(foreign).await.unwrap();
    assert!(created);
    assert_ne!(foreign_run.id, first.id);
    assert_eq!(foreign_run.tenant, other_tenant);

    // Another key, or none at all, creates.
    let mut other_key = new_run(&tenant, "s");
    other_key.idempotency_key = Some(new_id("key"));
    assert!(store.create_run(other_key).await.unwrap().1);
    assert!(store.create_run(new_run(&tenant, "s")).await.unwrap().1);
    assert!(store.create_run(new_run(&tenant, "s")).await.unwrap().1);
}

pub async fn tenant_isolation(store: &Arc<dyn Store>) {
    let (a, b) = (new_id("ten"), new_id("ten"));
    let session = new_id("ses");
    let run_a = create(store, &a, &session).await;
    let run_b = create(store, &b, &session).await;
    store
        .commit(&run_a.id, messages_only(vec![Message::user("from a")]))
        .await
        .unwrap();
    store
        .commit(&run_b.id, messages_only(vec![Message::user("from b")]))
        .await
        .unwrap();

    assert!(store.get_run(&b, &run_a.id).await.unwrap().is_none());
    assert!(store.get_run(&a, &run_b.id).await.unwrap().is_none());

    let page = store.list_runs(&a, &filter(None, None, 0)).await.unwrap();
    assert_eq!(ids(&page.runs), vec![run_a.id.clone()]);
    let page = store
        .list_runs(&b, &filter(Some(&session), None, 0))
        .await
        .unwrap();
    assert_eq!(ids(&page.runs), vec![run_b.id.clone()]);

    let seen_a = store.session_messages(&a, &session).await.unwrap().unwrap();
    assert_eq!(seen_a, vec![(run_a.id.clone(), Message::user("from a"))]);
    let seen_b = store.session_messages(&b, &session).await.unwrap().unwrap();
    assert_eq!(seen_b, vec![(run_b.id.clone(), Message::user("from b"))]);
    assert!(
        store
            .session_messages(&new_id("ten"), &session)
            .await
            .unwrap()
            .is_none()
    );

    // Same session key, different tenants: separate histories.
    assert_eq!(
        store.history(&run_a.id).await.unwrap(),
        vec![Message::user("from a")]
    );
    assert_eq!(
        store.history(&run_b.id).await.unwrap(),
        vec![Message::user("from b")]
    );
}

pub async fn commit_numbers_events(store: &Arc<dyn Store>) {
    let tenant = new_id("ten");
    let run = create(store, &tenant, "s").await;
    let other = create(store, &tenant, "s").await;

    let kinds = vec![
        EventKind::RunStarted {
            input: run.input.clone(),
            session: "s".into(),
            agent: run.agent.clone(),
            metadata: serde_json::Value::Null,
        },
        EventKind::ToolCall {
            step: 1,
            call_id: "c1".into(),
            tool: "weather".into(),
            arguments: json!({"city": "Paris"}),
        },
        EventKind::Final {
            answer: "sunny".into(),
        },
    ];
    let before = keel_protocol::now();
    let first = store
        .commit(
            &run.id,
            Commit {
                approvals: Vec::new(),
                events: kinds.clone(),
                ..Commit::default()
            },
        )
        .await
        .unwrap();
    let after = keel_protocol::now();
    assert_eq!(
        first.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    for (event, kind) in first.iter().zip(&kinds) {
        assert_eq!(event.run_id, run.id);
        assert_eq!(&event.kind, kind);
        assert!(
            event.ts >= before && event.ts <= after,
            "ts is stamped at commit"
        );
    }

    let second = store
        .commit(
            &run.id,
            Commit {
                approvals: Vec::new(),
                events: vec![delta("a"), delta("b")],
                messages: vec![Message::user("m")],
                patch: None,
                calls: Vec::new(),
            },
        )
        .await
        .unwrap();
    assert_eq!(second.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![4, 5]);

    let none = store
        .commit(&run.id, messages_only(vec![Message::user("n")]))
        .await
        .unwrap();
    assert!(none.is_empty(), "a commit without events numbers nothing");

    // Another run has its own sequence.
    let theirs = store
        .commit(
            &other.id,
            Commit {
                approvals: Vec::new(),
                events: vec![delta("x")],
                ..Commit::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(theirs[0].seq, 1);

    let stored = store.get_run(&tenant, &run.id).await.unwrap().unwrap();
    assert_eq!(stored.last_seq, 5);

    let all: Vec<Event> = first.iter().chain(&second).cloned().collect();
    assert_eq!(store.events_after(&run.id, 0, 100).await.unwrap(), all);
    let middle = store.events_after(&run.id, 2, 2).await.unwrap();
    assert_eq!(middle, all[2..4].to_vec());
    assert_eq!(
        store.events_after(&run.id, 4, 100).await.unwrap(),
        all[4..].to_vec()
    );
    assert!(
        store
            .events_after(&run.id, 5, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .events_after(&run.id, u64::MAX, 100)
            .await
            .unwrap()
            .is_empty()
    );
    match store.events_after(&new_id("run"), 0, 100).await {
        Ok(events) => assert!(events.is_empty()),
        Err(StoreError::NotFound) => {}
        Err(e) => panic!("events of an unknown run: {e:?}"),
    }
}

pub async fn commit_to_unknown_run_is_not_found(store: &Arc<dyn Store>) {
    let commit = Commit {
        calls: Vec::new(),
        approvals: Vec::new(),
        events: vec![delta("x")],
        messages: vec![Message::user("x")],
        patch: Some(RunPatch {
            steps: Some(1),
            ..RunPatch::default()
        }),
    };
    let err = store.commit(&new_id("run"), commit).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound), "got {err:?}");
}

/// `tasks` commits of three events each race on one run; the log must come
/// out numbered 1..=3*tasks with each commit's events adjacent.
pub async fn concurrent_commits_are_gap_free(store: &Arc<dyn Store>, tasks: u32) {
    let tenant = new_id("ten");
    let run = create(store, &tenant, &new_id("ses")).await;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let store = Arc::clone(store);
        let run_id = run.id.clone();
        handles.push(tokio::spawn(async move {
            let commit = Commit {
                calls: Vec::new(),
                approvals: Vec::new(),
                events: (0..3).map(|i| delta(&format!("{t}/{i}"))).collect(),
                messages: vec![Message::user(format!("message {t}"))],
                patch: Some(RunPatch {
                    steps: Some(t),
                    ..RunPatch::default()
                }),
            };
            (t, store.commit(&run_id, commit).await.unwrap())
        }));
    }
    let mut seqs = BTreeSet::new();
    let mut returned = Vec::new();
    for handle in handles {
        let (t, events) = handle.await.unwrap();
        assert_eq!(events.len(), 3);
        for (i, event) in events.iter().enumerate() {
            assert_eq!(
                event.seq,
                events[0].seq + i as u64,
                "one commit's events are adjacent"
            );
            assert_eq!(event.kind, delta(&format!("{t}/{i}")));
            assert!(seqs.insert(event.seq), "seq {} handed out twice", event.seq);
        }
        returned.extend(events);
    }
    let total = u64::from(tasks) * 3;
    assert_eq!(
        seqs,
        (1..=total).collect::<BTreeSet<_>>(),
        "seqs are gap-free"
    );

    returned.sort_by_key(|e| e.seq);
    let stored = store.events_after(&run.id, 0, u32::MAX).await.unwrap();
    assert_eq!(
        stored, returned,
        "the log holds exactly what the commits returned"
    );
    let record = store.get_run(&tenant, &run.id).await.unwrap().unwrap();
    assert_eq!(record.last_seq, total);
    let messages = store
        .session_messages(&tenant, &run.session)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(messages.len(), tasks as usize);
}

pub async fn patch_semantics(store: &Arc<dyn Store>) {
    let tenant = new_id("ten");
    let run = create(store, &tenant, "s").await;
    tokio::time::sleep(Duration::from_millis(5)).await;

    let usage = Usage {
        llm_calls: 1,
        tool_calls: 2,
        prompt_tokens: 100,
        completion_tokens: 20,
    };
    let pending = keel_protocol::Pending::Approval {
        approval_id: "ap_1".into(),
        tool: "wire".into(),
        arguments: json!({"amount": 5}),
        risk: keel_protocol::Risk::Dangerous,
        reason: "wire transfers need approval".into(),
        expires_at: keel_protocol::now(),
    };
    let state = json!({"counters": {"repeat": 2}, "pending_call": null});
    store
        .commit(
            &run.id,
            patch_only(RunPatch {
                status: Some(RunStatus::WaitingApproval),
                pending: Some(Some(pending.clone())),
                steps: Some(3),
                usage: Some(usage),
                state: Some(state.to_string()),
                ..RunPatch::default()
            }),
        )
        .await
        .unwrap();
    let after_first = store.get_run(&tenant, &run.id).await.unwrap().unwrap();
    assert_eq!(after_first.status, RunStatus::WaitingApproval);
    assert_eq!(after_first.pending, Some(pending.clone()));
    assert_eq!(after_first.steps, 3);
    assert_eq!(after_first.usage, usage);
    assert_eq!(after_first.state, state);
    assert_eq!(after_first.output, None);
    assert_eq!(after_first.error, None);
    assert_eq!(after_first.created_at, run.created_at);
    assert!(after_first.updated_at > run.updated_at, "updated_at moves");
    assert_eq!(after_first.metadata, run.metadata);
    assert_eq!(after_first.principal, run.principal);

    // Fields left `None` stay as they are.
    tokio::time::sleep(Duration::from_millis(5)).await;
    store
        .commit(
            &run.id,
            patch_only(RunPatch {
                steps: Some(4),
                ..RunPatch::default()
            }),
        )
        .await
        .unwrap();
    let after_second = store.get_run(&tenant, &run.id).await.unwrap().unwrap();
    assert_eq!(after_second.steps, 4);
    assert_eq!(after_second.status, RunStatus::WaitingApproval);
    assert_eq!(after_second.pending, Some(pending));
    assert_eq!(after_second.usage, usage);
    assert_eq!(after_second.state, state);
    assert!(after_second.updated_at > after_first.updated_at);

    // `Some(Null)` clears pending and nothing else.
    store
        .commit(
            &run.id,
            patch_only(RunPatch {
                status: Some(RunStatus::Running),
                pending: Some(None),
                ..RunPatch::default()
            }),
        )
        .await
        .unwrap();
    let cleared = store.get_run(&tenant, &run.id).await.unwrap().unwrap();
    assert_eq!(cleared.pending, None);
    assert_eq!(cleared.status, RunStatus::Running);
    assert_eq!(cleared.steps, 4);
    assert_eq!(cleared.state, state);

    let error = ErrorBody::new("budget_exceeded", "too many steps");
    store
        .commit(
            &run.id,
            Commit {
                calls: Vec::new(),
                approvals: Vec::new(),
                events: vec![EventKind::RunFailed {
                    error: error.clone(),
                }],
                messages: vec![],
                patch: Some(RunPatch {
                    status: Some(RunStatus::Failed),
                    output: Some("partial answer".into()),
                    error: Some(error.clone()),
                    ..RunPatch::default()
                }),
            },
        )
        .await
        .unwrap();
    let failed = store.get_run(&tenant, &run.id).await.unwrap().unwrap();
    assert_eq!(failed.status, RunStatus::Failed);
    assert_eq!(failed.output.as_deref(), Some("partial answer"));
    assert_eq!(failed.error, Some(error));
    assert_eq!(failed.last_seq, 1);
    assert_eq!(failed.steps, 4);
    assert_eq!(failed.usage, usage);
    assert_eq!(failed.input, run.input);
    assert_eq!(failed.session, run.session);
}

pub async fn history_order(store: &Arc<dyn Store>) {
    let tenant = new_id("ten");
    let session = new_id("ses");
    let say = |store: &Arc<dyn Store>, run: &RunRecord, commit: Commit| {
        let store = Arc::clone(store);
        let id = run.id.clone();
        async move { store.commit(&id, commit).await.unwrap() }
    };
    let a1 = Message::user("a1");
    let a2 = Message::Assistant {
        content: String::new(),
        tool_calls: vec![ToolCall {
            id: "c1".into(),
            name: "weather".into(),
            arguments: "{\"city\":".into(),
        }],
    };
    let a3 = Message::Tool {
        call_id: "c1".into(),
        name: "weather".into(),
        content: "invalid arguments".into(),
        is_error: true,
    };
    let b1 = Message::user("b1");
    let b2 = Message::Assistant {
        content: "b2".into(),
        tool_calls: vec![],
    };
    let c1 = Message::system("c1");

    // Commits with events and without, interleaved.
    let run_a = create(store, &tenant, &session).await;
    say(store, &run_a, turn_with(vec![a1.clone(), a2.clone()])).await;
    let run_b = create(store, &tenant, &session).await;
    say(store, &run_b, messages_only(vec![b1.clone()])).await;
    // A was created before B, so what it writes now still belongs to B's past.
    say(store, &run_a, turn_with(vec![a3.clone()])).await;
    let run_c = create(store, &tenant, &session).await;
    say(store, &run_c, messages_only(vec![c1.clone()])).await;
    say(store, &run_b, turn_with(vec![b2.clone()])).await;

    // Noise that must never leak in: another session, another tenant.
    let elsewhere = create(store, &tenant, &new_id("ses")).await;
    say(
        store,
        &elsewhere,
        turn_with(vec![Message::user("other session")]),
    )
    .await;
    let foreign = create(store, &new_id("ten"), &session).await;
    say(
        store,
        &foreign,
        turn_with(vec![Message::user("other tenant")]),
    )
    .await;

    assert_eq!(
        store.history(&run_a.id).await.unwrap(),
        vec![a1.clone(), a2.clone(), a3.clone()],
        "runs created later are not part of a run's history"
    );
    assert_eq!(
        store.history(&run_b.id).await.unwrap(),
        vec![a1.clone(), a2.clone(), a3.clone(), b1.clone(), b2.clone()],
        "earlier runs' messages come first, then the run's own"
    );
    assert_eq!(
        store.history(&run_c.id).await.unwrap(),
        vec![a1, a2, b1, a3, b2, c1],
        "earlier runs' messages keep their insertion order among themselves"
    );
    let fresh = create(store, &tenant, &new_id("ses")).await;
    assert!(store.history(&fresh.id).await.unwrap().is_empty());
    let err = store.history(&new_id("run")).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound), "got {err:?}");
}

pub async fn session_messages(store: &Arc<dyn Store>) {
    let tenant = new_id("ten");
    let session = new_id("ses");
    let first = create(store, &tenant, &session).await;
    let second = create(store, &tenant, &session).await;
    let quiet = new_id("ses");
    create(store, &tenant, &quiet).await;

    store
        .commit(
            &first.id,
            messages_only(vec![Message::user("1"), Message::user("2")]),
        )
        .await
        .unwrap();
    store
        .commit(&second.id, turn_with(vec![Message::user("3")]))
        .await
        .unwrap();
    store
        .commit(&first.id, messages_only(vec![Message::user("4")]))
        .await
        .unwrap();

    let messages = store.session_messages(&tenant, &session).await.unwrap();
    assert_eq!(
        messages,
        Some(vec![
            (first.id.clone(), Message::user("1")),
            (first.id.clone(), Message::user("2")),
            (second.id.clone(), Message::user("3")),
            (first.id.clone(), Message::user("4")),
        ])
    );
    assert_eq!(
        store.session_messages(&tenant, &quiet).await.unwrap(),
        Some(vec![]),
        "a session with runs but no messages exists"
    );
    assert!(
        store
            .session_messages(&tenant, &new_id("ses"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .session_messages(&new_id("ten"), &session)
            .await
            .unwrap()
            .is_none()
    );
}

pub async fn list_filters_and_pagination(store: &Arc<dyn Store>) {
    let tenant = new_id("ten");
    let (x, y) = (new_id("ses"), new_id("ses"));
    let mut runs = Vec::new();
    for i in 0..8 {
        runs.push(create(store, &tenant, if i < 5 { &x } else { &y }).await);
    }
    for i in [1, 3, 6] {
        set_status(store, &runs[i].id, RunStatus::Completed).await;
    }
    set_status(store, &runs[2].id, RunStatus::Failed).await;
    let newest_first = |picked: &[usize]| -> Vec<String> {
        let mut picked = picked.to_vec();
        picked.sort_unstable_by(|a, b| b.cmp(a));
        ids_of(&picked.iter().map(|&i| &runs[i]).collect::<Vec<_>>())
    };

    let page = store
        .list_runs(&tenant, &filter(None, None, 0))
        .await
        .unwrap();
    assert_eq!(ids(&page.runs), newest_first(&[0, 1, 2, 3, 4, 5, 6, 7]));
    assert_eq!(page.next_cursor, None, "a single page has no cursor");
    let statuses: Vec<RunStatus> = page.runs.iter().map(|r| r.status).collect();
    assert_eq!(statuses[1], RunStatus::Completed);
    assert!(page.runs.iter().all(|r| r.tenant == tenant));

    assert_eq!(
        all_pages(store, &tenant, filter(None, None, 3)).await,
        vec![
            newest_first(&[5, 6, 7]),
            newest_first(&[2, 3, 4]),
            newest_first(&[0, 1]),
        ]
    );
    assert_eq!(
        all_pages(store, &tenant, filter(None, None, 4)).await,
        vec![newest_first(&[4, 5, 6, 7]), newest_first(&[0, 1, 2, 3])],
        "an exactly full last page has no cursor"
    );

    let page = store
        .list_runs(&tenant, &filter(Some(&x), None, 0))
        .await
        .unwrap();
    assert_eq!(ids(&page.runs), newest_first(&[0, 1, 2, 3, 4]));
    let page = store
        .list_runs(&tenant, &filter(None, Some(RunStatus::Completed), 0))
        .await
        .unwrap();
    assert_eq!(ids(&page.runs), newest_first(&[1, 3, 6]));
    let page = store
        .list_runs(&tenant, &filter(None, Some(RunStatus::Queued), 0))
        .await
        .unwrap();
    assert_eq!(ids(&page.runs), newest_first(&[0, 4, 5, 7]));
    assert_eq!(
        all_pages(
            store,
            &tenant,
            filter(Some(&x), Some(RunStatus::Completed), 1)
        )
        .await,
        vec![newest_first(&[3]), newest_first(&[1])]
    );
    let page = store
        .list_runs(&tenant, &filter(Some(&y), Some(RunStatus::Failed), 0))
        .await
        .unwrap();
    assert!(page.runs.is_empty());
    assert_eq!(page.next_cursor, None);

    // Two runs of another agent, one of them in session x and completed.
    let mut planner = Vec::new();
    for _ in 0..2 {
        let mut req = new_run(&tenant, &x);
        req.agent = "planner".into();
        planner.push(store.create_run(req).await.unwrap().0);
    }
    set_status(store, &planner[0].id, RunStatus::Completed).await;
    let mut by_agent = filter(None, None, 0);
    by_agent.agent = Some("planner".into());
    let page = store.list_runs(&tenant, &by_agent).await.unwrap();
    assert_eq!(
        ids(&page.runs),
        vec![planner[1].id.clone(), planner[0].id.clone()]
    );
    by_agent.session = Some(x.clone());
    by_agent.status = Some(RunStatus::Completed);
    let page = store.list_runs(&tenant, &by_agent).await.unwrap();
    assert_eq!(ids(&page.runs), vec![planner[0].id.clone()]);
    by_agent.agent = Some("assistant".into());
    let page = store.list_runs(&tenant, &by_agent).await.unwrap();
    assert_eq!(ids(&page.runs), newest_first(&[1, 3]));

    let page = store
        .list_runs(&new_id("ten"), &filter(None, None, 0))
        .await
        .unwrap();
    assert!(page.runs.is_empty());
    assert_eq!(page.next_cursor, None);

    let mut bad = filter(None, None, 3);
    bad.cursor = Some("not a cursor".into());
    assert!(
        store.list_runs(&tenant, &bad).await.is_err(),
        "a malformed cursor is refused"
    );
}

pub async fn list_page_sizes(store: &Arc<dyn Store>) {
    let tenant = new_id("ten");
    let mut created = Vec::new();
    for _ in 0..105 {
        created.push(create(store, &tenant, "s").await.id);
    }
    created.reverse();

    let page = store
        .list_runs(&tenant, &filter(None, None, 0))
        .await
        .unwrap();
    assert_eq!(ids(&page.runs), created[..20].to_vec(), "limit 0 means 20");
    assert!(page.next_cursor.is_some());

    let page = store
        .list_runs(&tenant, &filter(None, None, 1000))
        .await
        .unwrap();
    assert_eq!(
        ids(&page.runs),
        created[..100].to_vec(),
        "limit is capped at 100"
    );
    let mut rest = filter(None, None, 1000);
    rest.cursor = page.next_cursor;
    assert!(rest.cursor.is_some());
    let page = store.list_runs(&tenant, &rest).await.unwrap();
    assert_eq!(ids(&page.runs), created[100..].to_vec());
    assert_eq!(page.next_cursor, None);
}

pub async fn unfinished_runs(store: &Arc<dyn Store>) {
    let tenant = new_id("ten");
    let statuses = [
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::Completed,
        RunStatus::WaitingApproval,
        RunStatus::Cancelled,
        RunStatus::Failed,
        RunStatus::WaitingInput,
    ];
    let mut runs = Vec::new();
    for status in statuses {
        let run = create(store, &tenant, "s").await;
        if status != RunStatus::Queued {
            set_status(store, &run.id, status).await;
        }
        runs.push((run, status));
    }
    let ours: Vec<RunRecord> = store
        .unfinished_runs()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.tenant == tenant)
        .collect();
    let expected: Vec<(String, RunStatus)> = runs
        .iter()
        .filter(|(_, s)| !s.is_terminal())
        .map(|(r, s)| (r.id.clone(), *s))
        .collect();
    let got: Vec<(String, RunStatus)> = ours.iter().map(|r| (r.id.clone(), r.status)).collect();
    assert_eq!(got, expected, "non-terminal runs, oldest first");
    for run in &ours {
        assert_eq!(
            run.principal,
            Some(principal(&tenant)),
            "resumable after a restart"
        );
    }
}

/// A pending approval of `run`, as the loop would create it.
pub fn approval(run: &RunRecord, call_id: &str) -> ApprovalRecord {
    let created_at = keel_protocol::now();
    ApprovalRecord {
        id: new_id("apr"),
        tenant: run.tenant.clone(),
        run_id: run.id.clone(),
        call_id: call_id.to_owned(),
        tool: "wire_money".into(),
        arguments: json!({"to": "acct-1", "amount": 125.5, "memo": null}),
        risk: keel_protocol::Risk::Dangerous,
        reason: "requires approval".into(),
        status: ApprovalStatus::Pending,
        decided_by: None,
        decision_reason: None,
        created_at,
        decided_at: None,
        expires_at: created_at + Duration::from_secs(3600),
    }
}

/// Commits approvals the way the loop does: with the event and the status
/// change that stop the run.
async fn request_approvals(store: &Arc<dyn Store>, run: &RunRecord, approvals: &[ApprovalRecord]) {
    let events = approvals
        .iter()
        .map(|a| EventKind::ApprovalRequired {
            approval_id: a.id.clone(),
            tool: a.tool.clone(),
            arguments: a.arguments.clone(),
            risk: a.risk,
            reason: a.reason.clone(),
        })
        .collect();
    let commit = Commit {
        events,
        approvals: approvals.to_vec(),
        patch: Some(RunPatch {
            status: Some(RunStatus::WaitingApproval),
            ..RunPatch::default()
        }),
        ..Commit::default()
    };
    store.commit(&run.id, commit).await.unwrap();
}

async fn approval_ids(
    store: &Arc<dyn Store>,
    tenant: &str,
    status: Option<ApprovalStatus>,
    limit: u32,
) -> Vec<String> {
    store
        .list_approvals(tenant, status, limit)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect()
}

pub async fn approvals(store: &Arc<dyn Store>) {
    let tenant = new_id("ten");
    let run = create(store, &tenant, &new_id("ses")).await;
    let other_run = create(store, &tenant, &new_id("ses")).await;
    // `later` gets the smaller id but the later creation time: listing
    // follows creation time.
    let mut later = approval(&run, "c2");
    let earlier = approval(&run, "c1");
    later.created_at = earlier.created_at + Duration::from_millis(10);
    later.expires_at = later.created_at + Duration::from_secs(3600);
    assert!(later.id < earlier.id);
    request_approvals(store, &run, &[later.clone(), earlier.clone()]).await;
    let mut third = approval(&other_run, "c1");
    third.created_at = later.created_at + Duration::from_millis(10);
    request_approvals(store, &other_run, &[third.clone()]).await;

    let stored_run = store.get_run(&tenant, &run.id).await.unwrap().unwrap();
    assert_eq!(stored_run.status, RunStatus::WaitingApproval);
    assert_eq!(stored_run.last_seq, 2);

    // Read back exactly as written, only by its own tenant.
    assert_eq!(
        store.get_approval(&tenant, &earlier.id).await.unwrap(),
        Some(earlier.clone())
    );
    assert_eq!(
        store.get_approval(&tenant, &later.id).await.unwrap(),
        Some(later.clone())
    );
    let stranger = new_id("ten");
    assert_eq!(
        store.get_approval(&stranger, &earlier.id).await.unwrap(),
        None
    );
    assert_eq!(
        store.get_approval(&tenant, &new_id("apr")).await.unwrap(),
        None
    );

    // Listing: oldest first, by status, bounded, per tenant.
    assert_eq!(
        approval_ids(store, &tenant, None, 0).await,
        vec![earlier.id.clone(), later.id.clone(), third.id.clone()]
    );
    assert_eq!(
        approval_ids(store, &tenant, Some(ApprovalStatus::Pending), 0).await,
        vec![earlier.id.clone(), later.id.clone(), third.id.clone()]
    );
    assert_eq!(
        approval_ids(store, &tenant, None, 2).await,
        vec![earlier.id.clone(), later.id.clone()]
    );
    assert!(
        approval_ids(store, &tenant, Some(ApprovalStatus::Approved), 0)
            .await
            .is_empty()
    );
    assert!(approval_ids(store, &stranger, None, 0).await.is_empty());
    let listed = store.list_approvals(&tenant, None, 1).await.unwrap();
    assert_eq!(
        listed,
        vec![earlier.clone()],
        "listing returns whole records"
    );

    // Another tenant cannot decide it, and an unknown one is not found.
    let err = store
        .decide_approval(
            &stranger,
            &earlier.id,
            ApprovalStatus::Approved,
            "mallory",
            "",
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound), "got {err:?}");
    let err = store
        .decide_approval(
            &tenant,
            &new_id("apr"),
            ApprovalStatus::Approved,
            "alice",
            "",
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound), "got {err:?}");
    // `pending` is not a decision.
    let err = store
        .decide_approval(&tenant, &earlier.id, ApprovalStatus::Pending, "alice", "")
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "got {err:?}");
    assert_eq!(
        store.get_approval(&tenant, &earlier.id).await.unwrap(),
        Some(earlier.clone()),
        "refused decisions change nothing"
    );

    // Decided once.
    let before = keel_protocol::now();
    let approved = store
        .decide_approval(
            &tenant,
            &earlier.id,
            ApprovalStatus::Approved,
            "alice",
            "looks fine",
        )
        .await
        .unwrap();
    let after = keel_protocol::now();
    assert_eq!(approved.status, ApprovalStatus::Approved);
    assert_eq!(approved.decided_by.as_deref(), Some("alice"));
    assert_eq!(approved.decision_reason.as_deref(), Some("looks fine"));
    let decided_at = approved.decided_at.expect("a decision is stamped");
    assert!(decided_at >= before && decided_at <= after);
    let unchanged = ApprovalRecord {
        status: ApprovalStatus::Pending,
        decided_by: None,
        decision_reason: None,
        decided_at: None,
        ..approved.clone()
    };
    assert_eq!(
        unchanged, earlier,
        "a decision changes only the decision fields"
    );
    assert_eq!(
        store.get_approval(&tenant, &earlier.id).await.unwrap(),
        Some(approved.clone())
    );

    // A second decision, whatever it is, conflicts and changes nothing.
    for decision in [
        ApprovalStatus::Denied,
        ApprovalStatus::Approved,
        ApprovalStatus::Expired,
    ] {
        let err = store
            .decide_approval(&tenant, &earlier.id, decision, "bob", "too late")
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Conflict(_)), "got {err:?}");
    }
    assert_eq!(
        store.get_approval(&tenant, &earlier.id).await.unwrap(),
        Some(approved.clone())
    );

    let denied = store
        .decide_approval(&tenant, &later.id, ApprovalStatus::Denied, "bob", "no")
        .await
        .unwrap();
    assert_eq!(denied.status, ApprovalStatus::Denied);
    let expired = store
        .decide_approval(
            &tenant,
            &third.id,
            ApprovalStatus::Expired,
            "keel",
            "timed out",
        )
        .await
        .unwrap();
    assert_eq!(expired.status, ApprovalStatus::Expired);

    assert!(
        approval_ids(store, &tenant, Some(ApprovalStatus::Pending), 0)
            .await
            .is_empty()
    );
    assert_eq!(
        store
            .list_approvals(&tenant, Some(ApprovalStatus::Approved), 0)
            .await
            .unwrap(),
        vec![approved]
    );
    assert_eq!(
        store
            .list_approvals(&tenant, Some(ApprovalStatus::Denied), 0)
            .await
            .unwrap(),
        vec![denied]
    );
    assert_eq!(
        approval_ids(store, &tenant, Some(ApprovalStatus::Expired), 0).await,
        vec![third.id]
    );
}

/// An approval is written with the rest of its commit or not at all.
pub async fn approval_commit_is_atomic(store: &Arc<dyn Store>) {
    let tenant = new_id("ten");
    let run = create(store, &tenant, &new_id("ses")).await;

    // To an unknown run: nothing is created.
    let mut ghost = approval(&run, "c1");
    ghost.run_id = new_id("run");
    let err = store
        .commit(
            &ghost.run_id.clone(),
            Commit {
                approvals: vec![ghost.clone()],
                ..Commit::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound), "got {err:?}");
    assert_eq!(store.get_approval(&tenant, &ghost.id).await.unwrap(), None);

    // An approval id that is taken fails the whole commit: no events, no
    // messages, no status change, and the other approval is not created.
    let first = approval(&run, "c1");
    request_approvals(store, &run, std::slice::from_ref(&first)).await;
    let fresh = approval(&run, "c2");
    let mut clash = approval(&run, "c3");
    clash.id = first.id.clone();
    let result = store
        .commit(
            &run.id,
            Commit {
                calls: Vec::new(),
                events: vec![delta("lost")],
                messages: vec![Message::user("lost")],
                approvals: vec![fresh.clone(), clash],
                patch: Some(RunPatch {
                    status: Some(RunStatus::Failed),
                    ..RunPatch::default()
                }),
            },
        )
        .await;
    assert!(result.is_err(), "a duplicate approval id is refused");
    assert_eq!(store.get_approval(&tenant, &fresh.id).await.unwrap(), None);
    assert_eq!(
        store.get_approval(&tenant, &first.id).await.unwrap(),
        Some(first)
    );
    let stored = store.get_run(&tenant, &run.id).await.unwrap().unwrap();
    assert_eq!(stored.status, RunStatus::WaitingApproval);
    assert_eq!(stored.last_seq, 1);
    assert_eq!(store.events_after(&run.id, 0, 100).await.unwrap().len(), 1);
    assert!(store.history(&run.id).await.unwrap().is_empty());

    // Numbering goes on where the failed commit did not.
    let next = store
        .commit(
            &run.id,
            Commit {
                events: vec![delta("kept")],
                ..Commit::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(next[0].seq, 2);
}

/// `deciders` tasks race to decide one approval: exactly one wins, the
/// others get `Conflict`, and the stored record is the winner's.
pub async fn concurrent_deciders_one_wins(store: &Arc<dyn Store>, deciders: u32) {
    let tenant = new_id("ten");
    let run = create(store, &tenant, &new_id("ses")).await;
    let pending = approval(&run, "c1");
    request_approvals(store, &run, std::slice::from_ref(&pending)).await;

    let mut handles = Vec::new();
    for d in 0..deciders {
        let store = Arc::clone(store);
        let (tenant, id) = (tenant.clone(), pending.id.clone());
        handles.push(tokio::spawn(async move {
            let decision = if d % 2 == 0 {
                ApprovalStatus::Approved
            } else {
                ApprovalStatus::Denied
            };
            let by = format!("approver-{d}");
            store
                .decide_approval(&tenant, &id, decision, &by, "raced")
                .await
        }));
    }
    let mut winners = Vec::new();
    for handle in handles {
        match handle.await.unwrap() {
            Ok(record) => winners.push(record),
            Err(StoreError::Conflict(_)) => {}
            Err(e) => panic!("a losing decider must get Conflict, got {e:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one decision wins: {winners:?}");
    let winner = winners.remove(0);
    assert_ne!(winner.status, ApprovalStatus::Pending);
    assert_eq!(
        store.get_approval(&tenant, &pending.id).await.unwrap(),
        Some(winner)
    );
}

/// Archiving moves a finished session's messages to a session of their own;
/// a session with a run still going, or of another tenant, is refused.
pub async fn archive_session(store: &Arc<dyn Store>) {
    let tenant = new_id("ten");
    let session = new_id("ses");
    let run = create(store, &tenant, &session).await;
    let busy = store.archive_session(&tenant, &session).await;
    assert!(matches!(busy, Err(StoreError::Conflict(_))), "{busy:?}");
    store
        .commit(
            &run.id,
            turn_with(vec![Message::user("F7 crucible replaced")]),
        )
        .await
        .unwrap();
    store
        .commit(
            &run.id,
            Commit {
                messages: vec![Message::user("noted")],
                patch: Some(RunPatch {
                    status: Some(keel_protocol::RunStatus::Completed),
                    ..RunPatch::default()
                }),
                ..Commit::default()
            },
        )
        .await
        .unwrap();
    let other = store.archive_session(&new_id("ten"), &session).await;
    assert!(matches!(other, Err(StoreError::NotFound)), "{other:?}");
    let (archived, messages) = store.archive_session(&tenant, &session).await.unwrap();
    assert!(archived.starts_with(&format!("{session}~")), "{archived}");
    assert_eq!(
        messages,
        vec![
            (run.id.clone(), Message::user("F7 crucible replaced")),
            (run.id.clone(), Message::user("noted")),
        ]
    );
    assert_eq!(
        store.session_messages(&tenant, &session).await.unwrap(),
        Some(vec![])
    );
    assert_eq!(
        store.session_messages(&tenant, &archived).await.unwrap(),
        Some(messages)
    );
    let later = create(store, &tenant, &session).await;
    assert!(
        store.history(&later.id).await.unwrap().is_empty(),
        "a new run starts fresh"
    );
}

/// The same channel message recorded by many writers at once: exactly one
/// sees it first. Other channels and tenants have their own ids.
pub async fn inbound_messages_count_once(store: &Arc<dyn Store>, writers: usize) {
    let tenant = new_id("ten");
    let message = new_id("upd");
    let tasks: Vec<_> = (0..writers)
        .map(|_| {
            let (store, tenant, message) = (store.clone(), tenant.clone(), message.clone());
            tokio::spawn(async move { store.record_inbound(&tenant, "tg", &message).await })
        })
        .collect();
    let mut firsts = 0;
    for t in tasks {
        if t.await.unwrap().unwrap() {
            firsts += 1;
        }
    }
    assert_eq!(firsts, 1, "one of {writers} concurrent writers is first");
    assert!(!store.record_inbound(&tenant, "tg", &message).await.unwrap());
    assert!(
        store
            .record_inbound(&tenant, "slack", &message)
            .await
            .unwrap()
    );
    assert!(
        store
            .record_inbound(&new_id("ten"), "tg", &message)
            .await
            .unwrap()
    );
}

/// Concurrent takes of a quota counter never together pass its limit, and
/// counters of one tenant, limit or period do not touch another's.
pub async fn quota_takes_never_pass_the_limit(store: &Arc<dyn Store>, takers: usize) {
    let tenant = new_id("ten");
    let key = QuotaKey {
        tenant: tenant.clone(),
        limit: QuotaLimit::ToolCallsPerDay,
        period: "2026-01-01".into(),
    };
    let limit = 7;
    let tasks: Vec<_> = (0..takers)
        .map(|_| {
            let (store, key) = (store.clone(), key.clone());
            tokio::spawn(async move { store.quota_take(&key, 1, limit).await })
        })
        .collect();
    let mut totals = BTreeSet::new();
    let mut taken = 0;
    for t in tasks {
        if let Some(total) = t.await.unwrap().unwrap() {
            taken += 1;
            totals.insert(total);
        }
    }
    assert_eq!(taken, limit.min(takers as u64), "takes granted");
    assert_eq!(
        totals,
        (1..=taken).collect::<BTreeSet<u64>>(),
        "each granted take saw its own total"
    );
    assert_eq!(store.quota_used(&key).await.unwrap(), taken);
    // A take bigger than what is left is refused whole; a smaller one fits.
    store.quota_give_back(&key, 3).await.unwrap();
    assert_eq!(store.quota_take(&key, 4, limit).await.unwrap(), None);
    assert_eq!(store.quota_take(&key, 3, limit).await.unwrap(), Some(7));
    assert_eq!(store.quota_take(&key, 8, limit).await.unwrap(), None);
    // Giving back never goes below zero.
    store.quota_give_back(&key, 100).await.unwrap();
    assert_eq!(store.quota_used(&key).await.unwrap(), 0);

    let next_day = QuotaKey {
        period: "2026-01-02".into(),
        ..key.clone()
    };
    let other_tenant = QuotaKey {
        tenant: new_id("ten"),
        ..key.clone()
    };
    let other_limit = QuotaKey {
        limit: QuotaLimit::TokensPerDay,
        ..key.clone()
    };
    for k in [&next_day, &other_tenant, &other_limit] {
        assert_eq!(store.quota_used(k).await.unwrap(), 0);
        assert_eq!(store.quota_take(k, 2, 2).await.unwrap(), Some(2));
    }
    assert_eq!(store.quota_used(&key).await.unwrap(), 0);
}

/// Run slots: at most `limit` held at once, even when taken concurrently;
/// the commit that ends a run gives its slot back, once.
pub async fn run_slots_are_given_back_when_runs_end(store: &Arc<dyn Store>, takers: usize) {
    let tenant = new_id("ten");
    let mut runs = Vec::new();
    for _ in 0..takers {
        runs.push(create(store, &tenant, &new_id("ses")).await);
    }
    let limit = 3;
    let tasks: Vec<_> = runs
        .iter()
        .map(|r| {
            let (store, tenant, id) = (store.clone(), tenant.clone(), r.id.clone());
            tokio::spawn(
                async move { (id.clone(), store.take_run_slot(&tenant, &id, limit).await) },
            )
        })
        .collect();
    let mut holders = Vec::new();
    for t in tasks {
        let (id, taken) = t.await.unwrap();
        if taken.unwrap() {
            holders.push(id);
        }
    }
    assert_eq!(holders.len() as u64, limit.min(takers as u64));
    let slots = QuotaKey {
        tenant: tenant.clone(),
        limit: QuotaLimit::MaxConcurrentRuns,
        period: String::new(),
    };
    assert_eq!(store.quota_used(&slots).await.unwrap(), limit);

    // A commit that does not end the run keeps the slot.
    set_status(store, &holders[0], RunStatus::Running).await;
    assert_eq!(store.quota_used(&slots).await.unwrap(), limit);
    // Ending it gives the slot back; a second terminal commit gives nothing more.
    set_status(store, &holders[0], RunStatus::Completed).await;
    assert_eq!(store.quota_used(&slots).await.unwrap(), limit - 1);
    set_status(store, &holders[0], RunStatus::Completed).await;
    assert_eq!(store.quota_used(&slots).await.unwrap(), limit - 1);
    // A slot of a run that was never created is given back by hand.
    let ghost = new_id("run");
    assert!(store.take_run_slot(&tenant, &ghost, limit).await.unwrap());
    assert!(
        !store
            .take_run_slot(&tenant, &new_id("run"), limit)
            .await
            .unwrap()
    );
    store.release_run_slot(&ghost).await.unwrap();
    store.release_run_slot(&ghost).await.unwrap();
    assert_eq!(store.quota_used(&slots).await.unwrap(), limit - 1);
}
