#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Properties of the SQLite store over random histories of one run:
//!
//! - folding the commits in order (events appended and numbered, patch
//!   fields replaced when given) rebuilds exactly the run the store holds,
//!   and so does a store reopened on the same file (a restarted node);
//! - reading the events after any `seq`, a page at a time as a resuming
//!   event stream does, gives each later event exactly once, in order.

use std::path::Path;

use keel_protocol::{
    Commit, CompletionReason, ErrorBody, Event, EventKind, Pending, PlannedCall, RunPatch,
    RunRecord, RunStatus, Store, Usage,
};
use keel_store::SqliteStore;
use keel_test_support::store_suite;
use proptest::prelude::*;
use serde_json::Value;

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn status() -> impl Strategy<Value = RunStatus> {
    prop::sample::select(vec![
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::WaitingInput,
        RunStatus::WaitingApproval,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ])
}

fn usage() -> impl Strategy<Value = Usage> {
    // The store keeps counters as SQL integers: at most i64::MAX.
    (
        0..=i64::MAX as u64,
        0..1000u64,
        0..1_000_000u64,
        0..1_000_000u64,
    )
        .prop_map(
            |(llm_calls, tool_calls, prompt_tokens, completion_tokens)| Usage {
                llm_calls,
                tool_calls,
                prompt_tokens,
                completion_tokens,
            },
        )
}

fn event() -> impl Strategy<Value = EventKind> {
    prop_oneof![
        ".{0,12}".prop_map(|text| EventKind::MessageDelta { text }),
        (any::<u32>(), "[a-z_]{1,8}", json()).prop_map(|(step, tool, arguments)| {
            EventKind::ToolCall {
                step,
                call_id: format!("call_{step}"),
                tool,
                arguments,
            }
        }),
        (any::<u32>(), json()).prop_map(|(step, arguments)| EventKind::ReactPlan {
            step,
            action: keel_protocol::Action::CallTool,
            tool_calls: vec![PlannedCall {
                call_id: format!("call_{step}"),
                tool: "t".into(),
                arguments,
            }],
            intent: None,
            confidence: Some(0.5),
            missing_slots: None,
            brief_rationale: None,
        }),
        ".{0,12}".prop_map(|answer| EventKind::Final { answer }),
        usage().prop_map(|usage| EventKind::RunCompleted {
            reason: CompletionReason::Answered,
            usage,
        }),
    ]
}

fn pending() -> impl Strategy<Value = Option<Pending>> {
    prop::option::of((".{0,10}", "[a-z_]{1,8}", any::<u32>()).prop_map(
        |(question, tool, round)| Pending::Input {
            question,
            tool,
            missing_slots: vec!["city".into()],
            round,
            handoff: round % 2 == 0,
        },
    ))
}

fn patch() -> impl Strategy<Value = RunPatch> {
    (
        prop::option::of(status()),
        prop::option::of(".{0,12}"),
        prop::option::of(pending()),
        prop::option::of(any::<u32>()),
        prop::option::of(usage()),
        prop::option::of((".{0,6}", ".{0,12}").prop_map(|(c, m)| ErrorBody::new(c, m))),
        // The loop writes its state as JSON text.
        prop::option::of(json().prop_map(|v| v.to_string())),
    )
        .prop_map(
            |(status, output, pending, steps, usage, error, state)| RunPatch {
                status,
                output,
                pending,
                steps,
                usage,
                error,
                state,
            },
        )
}

fn commits() -> impl Strategy<Value = Vec<(Vec<EventKind>, Option<RunPatch>)>> {
    prop::collection::vec(
        (
            prop::collection::vec(event(), 0..4),
            prop::option::of(patch()),
        ),
        0..8,
    )
}

/// What the run must be after `patch`: every field it gives replaces the
/// stored one, every field it leaves out stays.
fn fold(run: &mut RunRecord, patch: &RunPatch) {
    if let Some(s) = patch.status {
        run.status = s;
    }
    if let Some(o) = &patch.output {
        run.output = Some(o.clone());
    }
    if let Some(p) = &patch.pending {
        run.pending = p.clone();
    }
    if let Some(s) = patch.steps {
        run.steps = s;
    }
    if let Some(u) = patch.usage {
        run.usage = u;
    }
    if let Some(e) = &patch.error {
        run.error = Some(e.clone());
    }
    if let Some(s) = &patch.state {
        run.state = serde_json::from_str(s).expect("state text is JSON");
    }
}

/// The fields a commit can change, for comparison (timestamps aside).
fn written(run: &RunRecord) -> (RunStatus, Option<String>, Option<Pending>, u32, Usage) {
    (
        run.status,
        run.output.clone(),
        run.pending.clone(),
        run.steps,
        run.usage,
    )
}

fn assert_same_run(stored: &RunRecord, expected: &RunRecord) {
    assert_eq!(written(stored), written(expected));
    assert_eq!(stored.error, expected.error);
    assert_eq!(stored.state, expected.state);
    assert_eq!(stored.last_seq, expected.last_seq);
    assert_eq!(
        (&stored.input, &stored.session, &stored.metadata),
        (&expected.input, &expected.session, &expected.metadata)
    );
}

async fn all_events(store: &dyn Store, run_id: &str) -> Vec<Event> {
    store.events_after(run_id, 0, u32::MAX).await.unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Creates a run and applies `history` to it; returns the run as created,
/// folded, and the events as the commits returned them.
async fn write_history(
    path: &Path,
    history: &[(Vec<EventKind>, Option<RunPatch>)],
) -> (String, RunRecord, Vec<Event>) {
    let store = SqliteStore::open(path).unwrap();
    let (mut expected, _) = store
        .create_run(store_suite::new_run("acme", "s"))
        .await
        .unwrap();
    let mut committed = Vec::new();
    for (events, patch) in history {
        let numbered = store
            .commit(
                &expected.id,
                Commit {
                    events: events.clone(),
                    patch: patch.clone(),
                    ..Commit::default()
                },
            )
            .await
            .unwrap();
        let kinds: Vec<&EventKind> = numbered.iter().map(|e| &e.kind).collect();
        assert_eq!(kinds, events.iter().collect::<Vec<_>>());
        expected.last_seq += events.len() as u64;
        if let Some(p) = patch {
            fold(&mut expected, p);
        }
        committed.extend(numbered);
    }
    (expected.id.clone(), expected, committed)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn folding_the_commits_rebuilds_the_stored_run(history in commits()) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keel.db");
        runtime().block_on(async {
            let (id, expected, committed) = write_history(&path, &history).await;
            let seqs: Vec<u64> = committed.iter().map(|e| e.seq).collect();
            assert_eq!(seqs, (1..=committed.len() as u64).collect::<Vec<_>>());

            let store = SqliteStore::open(&path).unwrap();
            let stored = store.get_run("acme", &id).await.unwrap().unwrap();
            assert_same_run(&stored, &expected);
            assert_eq!(all_events(&store, &id).await, committed);
            drop(store);

            // A restarted node reads the same run and log.
            let reopened = SqliteStore::open(&path).unwrap();
            let again = reopened.get_run("acme", &id).await.unwrap().unwrap();
            assert_same_run(&again, &expected);
            assert_eq!(all_events(&reopened, &id).await, committed);
        });
    }

    #[test]
    fn resuming_after_any_seq_neither_loses_nor_repeats_an_event(
        history in commits(),
        after in 0u64..40,
        page in 1u32..8,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keel.db");
        runtime().block_on(async {
            let (id, _, committed) = write_history(&path, &history).await;
            let store = SqliteStore::open(&path).unwrap();
            // As a follower catches up: pages from the last seq it sent.
            let mut seen: Vec<Event> = Vec::new();
            let mut last = after;
            loop {
                let batch = store.events_after(&id, last, page).await.unwrap();
                assert!(batch.len() <= page as usize);
                let n = batch.len();
                for e in batch {
                    last = e.seq;
                    seen.push(e);
                }
                if n < page as usize {
                    break;
                }
            }
            let expected: Vec<Event> =
                committed.into_iter().filter(|e| e.seq > after).collect();
            assert_eq!(seen, expected);
        });
    }
}
