//! Drift detection on crafted foundry traces (SPEC §4.12).

use keel_guard::drift::{
    DriftInput, DriftReport, DriftSettings, StepTrace, assess, lexical_similarity, window_text,
};

const GOAL: &str =
    "How many batches did furnace F2 produce last week, and were there any restarts?";

fn step(tool: &str, args: &str, result: &str) -> StepTrace {
    StepTrace {
        step: 0,
        tool: tool.to_owned(),
        arguments: args.to_owned(),
        result: result.to_owned(),
        ok: true,
        outcome: None,
    }
}

/// Numbers the steps in order, as the run loop would.
fn trace(steps: Vec<StepTrace>) -> Vec<StepTrace> {
    steps
        .into_iter()
        .zip(1u32..)
        .map(|(s, n)| StepTrace { step: n, ..s })
        .collect()
}

fn input<'a>(goal: &'a str, steps: &'a [StepTrace]) -> DriftInput<'a> {
    DriftInput {
        goal,
        criterion: None,
        steps,
        semantic: None,
        baseline_calls: None,
    }
}

fn judge(goal: &str, steps: &[StepTrace]) -> DriftReport {
    assess(&input(goal, steps), &DriftSettings::default())
}

/// Asserts that no prefix of the trace (the score after each step) flags.
fn assert_never_flags(goal: &str, steps: &[StepTrace], settings: &DriftSettings) {
    for n in 0..=steps.len() {
        let report = assess(&input(goal, &steps[..n]), settings);
        assert!(
            !report.drifted,
            "flagged after step {n} of an on-track trace: {report:?}"
        );
        assert!(report.score >= settings.threshold || n < 2, "{report:?}");
    }
}

fn foundry_short() -> Vec<StepTrace> {
    trace(vec![
        step(
            "plant.batches",
            r#"{"furnace_id":"F2","week":"2026-W46"}"#,
            "Furnace F2 produced 14 batches in week 2026-W46 (Mon 3, Tue 2, Wed 3, Thu 2, Fri 4).",
        ),
        step(
            "plant.restarts",
            r#"{"furnace_id":"F2"}"#,
            "F2 was restarted 2 times: 2026-11-11 06:10 after a power dip, 2026-11-14 22:40 for maintenance.",
        ),
        step(
            "furnace_status",
            r#"{"furnace_id":"F2"}"#,
            "F2: running, temperature 1452 C, load 81 %.",
        ),
    ])
}

fn foundry_long() -> Vec<StepTrace> {
    let mut steps = vec![step(
        "plant.list_furnaces",
        "{}",
        "F1 (idle), F2 (running), F3 (maintenance)",
    )];
    for (day, n) in [("2026-11-09", 3), ("2026-11-10", 2), ("2026-11-11", 3)] {
        steps.push(step(
            "plant.batches_per_day",
            &format!(r#"{{"furnace_id":"F2","date":"{day}"}}"#),
            &format!("F2 produced {n} batches on {day}"),
        ));
    }
    steps.extend([
        step(
            "plant.batch_output",
            r#"{"furnace_id":"F2","week":"2026-W46"}"#,
            "F2 output week 2026-W46: 168.4 t in 14 batches, average 12.0 t per batch",
        ),
        step(
            "plant.alarms",
            r#"{"furnace_id":"F2","since":"2026-11-09"}"#,
            "F2 alarms: 2026-11-11 06:08 supply voltage low; 2026-11-14 22:35 scheduled stop",
        ),
        step(
            "plant.restarts",
            r#"{"furnace_id":"F2","week":"2026-W46"}"#,
            "F2 restarted 2 times in 2026-W46",
        ),
        step(
            "plant.restart_detail",
            r#"{"furnace_id":"F2","restart_id":"R-881"}"#,
            "Restart R-881 of F2 at 2026-11-11 06:10: cause power dip, downtime 25 min",
        ),
        step(
            "plant.restart_detail",
            r#"{"furnace_id":"F2","restart_id":"R-887"}"#,
            "Restart R-887 of F2 at 2026-11-14 22:40: cause maintenance, downtime 3 h",
        ),
        step(
            "furnace_status",
            r#"{"furnace_id":"F2"}"#,
            "F2: running, temperature 1452 C",
        ),
        step(
            "plant.batches_per_day",
            r#"{"furnace_id":"F2","date":"2026-11-12"}"#,
            "F2 produced 2 batches on 2026-11-12",
        ),
        step(
            "plant.batches_per_day",
            r#"{"furnace_id":"F2","date":"2026-11-13"}"#,
            "F2 produced 4 batches on 2026-11-13",
        ),
        step(
            "plant.shift_log",
            r#"{"furnace_id":"F2","week":"2026-W46"}"#,
            "Shift notes F2: restart after power dip handled by night shift; batch 1047 delayed",
        ),
    ]);
    trace(steps)
}

/// Three steps on track, then four into unrelated systems.
fn wandering() -> Vec<StepTrace> {
    let mut steps = foundry_short();
    steps.extend(trace(vec![
        step(
            "hr.payroll",
            r#"{"employee":"Maria Keller","month":"2026-10"}"#,
            "Gross salary 4,250.00 EUR, tax class 1, paid on 2026-10-28",
        ),
        step(
            "weather.forecast",
            r#"{"city":"Duisburg","days":3}"#,
            "Duisburg: rain on Monday, 12 degrees; cloudy Tuesday; sunny Wednesday",
        ),
        step(
            "crm.leads",
            r#"{"region":"north","status":"open"}"#,
            "12 open leads: Acme GmbH (score 81), Borsig AG (score 64), ...",
        ),
        step(
            "hr.vacation_balance",
            r#"{"employee":"Maria Keller"}"#,
            "Maria Keller: 11 vacation days left in 2026",
        ),
    ]));
    trace(steps)
}

#[test]
fn on_track_short_trace_never_flags() {
    let steps = foundry_short();
    assert_never_flags(GOAL, &steps, &DriftSettings::default());
    let report = judge(GOAL, &steps);
    assert!(report.relevance > 0.7, "{report:?}");
    assert_eq!(report.scope, 0.0);
    assert_eq!(report.repetition, 0.0);
    assert!(report.reason.starts_with("on track"), "{}", report.reason);
}

#[test]
fn long_on_track_trace_never_flags_with_default_expectation() {
    let steps = foundry_long();
    assert!(steps.len() >= 12);
    let settings = DriftSettings::default();
    assert_eq!(settings.expected_tool_calls, 0);
    assert_never_flags(GOAL, &steps, &settings);
    let report = judge(GOAL, &steps);
    assert!(report.relevance > 0.6, "{report:?}");
    assert!(report.score > 0.6, "{report:?}");
}

#[test]
fn json_results_with_ids_stay_on_track() {
    let steps = trace(vec![
        step(
            "plant.batches",
            r#"{"furnace_id":"F2","week":"2026-W46"}"#,
            r#"{"furnace_id":"F2","items":[{"batch_id":"B-1041","tonnes":12.1},{"batch_id":"B-1042","tonnes":11.8}],"total":14}"#,
        ),
        step(
            "plant.restarts",
            r#"{"furnace_id":"F2"}"#,
            r#"[{"restart_id":"R-881","at":"2026-11-11T06:10:00Z"},{"restart_id":"R-887","at":"2026-11-14T22:40:00Z"}]"#,
        ),
        step(
            "plant.batch",
            r#"{"batch_id":"B-1041"}"#,
            r#"{"batch_id":"B-1041","furnace_id":"F2","alloy":"GJS-400","status":"released"}"#,
        ),
        step(
            "furnace_status",
            r#"{"furnace_id":"F2"}"#,
            r#"{"id":"F2","state":"running","temp_c":1452}"#,
        ),
    ]);
    assert_never_flags(GOAL, &steps, &DriftSettings::default());
}

#[test]
fn short_goal_stays_on_track() {
    let goal = "status of F2?";
    let steps = trace(vec![
        step(
            "furnace_status",
            r#"{"furnace_id":"F2"}"#,
            "F2: running, temperature 1452 C",
        ),
        step(
            "plant.alarms",
            r#"{"furnace_id":"F2"}"#,
            "no open alarms on F2",
        ),
        step(
            "plant.batches",
            r#"{"furnace_id":"F2","week":"2026-W47"}"#,
            "5 batches so far this week",
        ),
    ]);
    assert_never_flags(goal, &steps, &DriftSettings::default());
}

#[test]
fn wandering_trace_flags_and_names_the_unrelated_tools() {
    let steps = wandering();
    // On track while it is on track.
    assert_never_flags(GOAL, &steps[..3], &DriftSettings::default());
    let report = judge(GOAL, &steps);
    assert!(report.drifted, "{report:?}");
    assert!(report.score < 0.35, "{report:?}");
    assert!(report.relevance < 0.2, "{report:?}");
    // A clean zero in the persisted report, not -0.0.
    assert!(report.relevance.is_sign_positive() && report.score.is_sign_positive());
    let json = serde_json::to_string(&report).unwrap();
    assert!(!json.contains("-0"), "{json}");
    for tool in [
        "hr.payroll",
        "weather.forecast",
        "crm.leads",
        "hr.vacation_balance",
    ] {
        assert!(
            report.reason.contains(tool),
            "{tool} not named: {}",
            report.reason
        );
    }
    for tool in ["plant.", "furnace_status"] {
        assert!(
            !report.reason.contains(tool),
            "{tool} named: {}",
            report.reason
        );
    }
    assert!(
        report.reason.starts_with("recent actions ("),
        "{}",
        report.reason
    );
}

#[test]
fn wandering_is_caught_once_it_dominates_the_window() {
    let steps = wandering();
    let flagged: Vec<bool> = (0..=steps.len())
        .map(|n| judge(GOAL, &steps[..n]).drifted)
        .collect();
    // Flagged by the time three of the four recent steps are off topic,
    // and stays flagged.
    assert_eq!(
        flagged,
        [false, false, false, false, false, false, true, true],
        "{flagged:?}"
    );
}

#[test]
fn incidental_generic_words_do_not_hide_wandering() {
    // Every unrelated step shares one everyday word with the goal.
    let mut steps = foundry_short();
    steps.extend([
        step(
            "weather.forecast",
            r#"{"city":"Duisburg"}"#,
            "rain all week",
        ),
        step(
            "hr.payroll",
            r#"{"employee":"Maria Keller"}"#,
            "last payment 2026-10-28",
        ),
        step("crm.leads", r#"{"region":"north"}"#, "total 12 open leads"),
        step(
            "news.headlines",
            r#"{"topic":"football"}"#,
            "results of last week",
        ),
    ]);
    let report = judge(GOAL, &trace(steps));
    assert!(report.drifted, "{report:?}");
    for tool in [
        "weather.forecast",
        "hr.payroll",
        "crm.leads",
        "news.headlines",
    ] {
        assert!(report.reason.contains(tool), "{}", report.reason);
    }
}

#[test]
fn criterion_counts_as_goal_text() {
    let steps = trace(vec![
        step("plant.alarms", r#"{"furnace_id":"F2"}"#, "no open alarms"),
        step(
            "plant.alarm_history",
            r#"{"furnace_id":"F2"}"#,
            "3 alarms closed",
        ),
    ]);
    let goal = "Is everything fine?";
    let without = judge(goal, &steps);
    let with = assess(
        &DriftInput {
            criterion: Some("names the open alarms of furnace F2"),
            ..input(goal, &steps)
        },
        &DriftSettings::default(),
    );
    assert!(
        with.relevance > without.relevance,
        "{with:?} vs {without:?}"
    );
    assert!(!with.drifted);
}

#[test]
fn calls_far_beyond_a_configured_expectation_lower_the_score() {
    let steps = foundry_long();
    let free = judge(GOAL, &steps);
    let strict = DriftSettings {
        expected_tool_calls: 4,
        ..DriftSettings::default()
    };
    let bounded = assess(&input(GOAL, &steps), &strict);
    // 13 calls are just past twice the lenient default of 6.
    assert!(free.scope < 0.1, "{free:?}");
    assert!(bounded.scope > 0.5, "{bounded:?}");
    assert!(bounded.score < free.score, "{bounded:?} vs {free:?}");
    assert!(
        bounded
            .reason
            .contains(&format!("{} calls vs ~4 expected", steps.len())),
        "{}",
        bounded.reason
    );
    // Within the configured expectation there is no penalty.
    let roomy = DriftSettings {
        expected_tool_calls: 20,
        expected_tools: 10,
        ..DriftSettings::default()
    };
    assert_eq!(assess(&input(GOAL, &steps), &roomy).scope, 0.0);
}

#[test]
fn penalty_grows_with_calls_beyond_the_expectation() {
    let steps = foundry_long();
    let strict = DriftSettings {
        expected_tool_calls: 3,
        ..DriftSettings::default()
    };
    let scopes: Vec<f32> = (1..=steps.len())
        .map(|n| assess(&input(GOAL, &steps[..n]), &strict).scope)
        .collect();
    assert!(scopes.windows(2).all(|w| w[1] >= w[0]), "{scopes:?}");
    assert_eq!(scopes[2], 0.0, "{scopes:?}");
    assert!(scopes[steps.len() - 1] == 1.0, "{scopes:?}");
}

#[test]
fn baseline_from_past_runs_sets_the_scope_expectation() {
    let steps = foundry_long();
    let with_baseline = |b: f32| {
        assess(
            &DriftInput {
                baseline_calls: Some(b),
                ..input(GOAL, &steps)
            },
            // Tools within expectation: only calls are judged.
            &DriftSettings {
                expected_tools: 10,
                ..DriftSettings::default()
            },
        )
    };
    // Similar runs take ~3 calls: 13 is far beyond (the learned baseline
    // gets the same 2x slack as the default).
    let tight = with_baseline(3.0);
    assert!(tight.scope > 0.0, "{tight:?}");
    assert!(
        tight.reason.contains("calls vs ~3 expected"),
        "{}",
        tight.reason
    );
    assert_eq!(with_baseline(8.0).scope, 0.0);
    // A configured expectation wins over the baseline.
    let configured = assess(
        &DriftInput {
            baseline_calls: Some(3.0),
            ..input(GOAL, &steps)
        },
        &DriftSettings {
            expected_tool_calls: 30,
            expected_tools: 10,
            ..DriftSettings::default()
        },
    );
    assert_eq!(configured.scope, 0.0);
    // Nonsense baselines fall back to the default expectation.
    let default = assess(
        &input(GOAL, &steps),
        &DriftSettings {
            expected_tools: 10,
            ..DriftSettings::default()
        },
    );
    assert!(default.scope > 0.0 && default.scope < 0.1, "{default:?}");
    assert_eq!(with_baseline(f32::NAN), default);
    assert_eq!(with_baseline(0.0), default);
    assert!(tight.scope > default.scope);
}

#[test]
fn many_distinct_tools_raise_the_scope_penalty() {
    let steps = trace(
        [
            "plant.batches",
            "plant.restarts",
            "plant.alarms",
            "plant.outputs",
            "plant.shift_log",
            "plant.energy",
            "plant.maintenance",
            "plant.quality",
            "plant.staff",
            "plant.orders",
        ]
        .iter()
        .map(|t| step(t, r#"{"furnace_id":"F2"}"#, "F2 data for week 2026-W46"))
        .collect(),
    );
    let few_tools = DriftSettings {
        expected_tools: 3,
        // Calls alone within expectation: only the tool count is judged.
        expected_tool_calls: 20,
        ..DriftSettings::default()
    };
    let report = assess(&input(GOAL, &steps), &few_tools);
    assert!(report.scope > 0.5, "{report:?}");
    assert!(
        report.reason.contains("10 distinct tools vs ~3 expected"),
        "{}",
        report.reason
    );
    let lenient = assess(
        &input(GOAL, &steps),
        &DriftSettings {
            expected_tool_calls: 20,
            ..DriftSettings::default()
        },
    );
    assert!(lenient.scope < report.scope, "{lenient:?}");
    assert!(lenient.score > report.score);
}

#[test]
fn repeating_one_call_without_new_results_is_penalized() {
    let call = || {
        step(
            "plant.batches",
            r#"{"furnace_id":"F2","week":"2026-W46"}"#,
            "F2 produced 14 batches in 2026-W46",
        )
    };
    let four = trace(vec![call(), call(), call(), call()]);
    let report = judge(GOAL, &four);
    assert!(report.repetition > 0.5, "{report:?}");
    assert!((report.repetition - 0.75).abs() < 1e-6, "{report:?}");
    // Chosen weights: repeating a relevant call four times is not yet drift
    // (loop detection warns about it); the score drops noticeably though.
    assert!(!report.drifted, "{report:?}");
    assert!(report.score < judge(GOAL, &foundry_short()).score);
    assert!(
        report.reason.contains(
            "3 of the last 4 calls repeated earlier calls with the same result (plant.batches)"
        ),
        "{}",
        report.reason
    );
    // A window made only of repeats brought nothing new at all: drift.
    let five = trace(vec![call(), call(), call(), call(), call()]);
    let report = judge(GOAL, &five);
    assert_eq!(report.repetition, 1.0);
    assert!(report.drifted, "{report:?}");
    assert!(
        report
            .reason
            .starts_with("4 of the last 4 calls repeated earlier calls"),
        "{}",
        report.reason
    );
    // The call is on topic: relevance is not blamed.
    assert!(!report.reason.contains("share little"), "{}", report.reason);
}

#[test]
fn repetition_uses_the_outcome_fingerprint() {
    let poll = |fp: &str, result: &str| StepTrace {
        outcome: Some(fp.to_owned()),
        ..step("furnace_status", r#"{"furnace_id":"F2"}"#, result)
    };
    // Results that differ only in text the fingerprint ignores: repeats.
    let same = trace(vec![
        poll("aaa", "F2 running (checked 10:00)"),
        poll("aaa", "F2 running (checked 10:01)"),
        poll("aaa", "F2 running (checked 10:02)"),
    ]);
    assert!((judge(GOAL, &same).repetition - 2.0 / 3.0).abs() < 1e-6);
    // A status that keeps changing is progress, not repetition.
    let changing = trace(vec![
        poll("aaa", "F2 heating"),
        poll("bbb", "F2 melting"),
        poll("ccc", "F2 pouring"),
    ]);
    assert_eq!(judge(GOAL, &changing).repetition, 0.0);
    // Argument key order does not disguise a repeat.
    let reordered = trace(vec![
        step(
            "plant.batches",
            r#"{"furnace_id":"F2","week":"2026-W46"}"#,
            "14 batches",
        ),
        step(
            "plant.batches",
            r#"{"week":"2026-W46","furnace_id":"F2"}"#,
            "14 batches",
        ),
    ]);
    assert_eq!(judge(GOAL, &reordered).repetition, 0.5);
}

#[test]
fn repetition_counts_only_the_window() {
    let call = || {
        step(
            "plant.restarts",
            r#"{"furnace_id":"F2"}"#,
            "F2 restarted 2 times",
        )
    };
    let mut steps = vec![call(), call(), call()];
    steps.extend(foundry_short().into_iter().take(2).map(|s| StepTrace {
        result: format!("{} (fresh)", s.result),
        ..s
    }));
    steps.push(step(
        "plant.alarms",
        r#"{"furnace_id":"F2"}"#,
        "no alarms on F2",
    ));
    steps.push(step(
        "plant.outputs",
        r#"{"furnace_id":"F2"}"#,
        "F2 output 168 t",
    ));
    let steps = trace(steps);
    // The repeats are older than the last four steps.
    assert_eq!(judge(GOAL, &steps).repetition, 0.0);
}

#[test]
fn assessment_is_deterministic() {
    let steps = wandering();
    let settings = DriftSettings {
        expected_tool_calls: 3,
        ..DriftSettings::default()
    };
    let first = assess(&input(GOAL, &steps), &settings);
    for _ in 0..50 {
        // A separately built trace and repeated calls: any hash-order
        // dependence would show up as a different score or reason.
        let again = wandering();
        assert_eq!(assess(&input(GOAL, &again), &settings), first);
    }
    assert!(first.drifted);
    assert!(
        first.reason.contains("calls vs ~3 expected"),
        "{}",
        first.reason
    );
    assert_eq!(window_text(&steps, 4), window_text(&wandering(), 4));
    assert_eq!(
        lexical_similarity(GOAL, &window_text(&steps, 4)),
        lexical_similarity(GOAL, &window_text(&wandering(), 4))
    );
}

#[test]
fn semantic_similarity_overrides_a_low_lexical_relevance() {
    let steps = wandering();
    let with = |semantic: Option<f32>| {
        assess(
            &DriftInput {
                semantic,
                ..input(GOAL, &steps)
            },
            &DriftSettings::default(),
        )
    };
    let lexical = with(None);
    assert!(lexical.drifted);
    // The embedder vouches for the window (e.g. paraphrases): not drift.
    let vouched = with(Some(0.9));
    assert!((vouched.relevance - 0.9).abs() < 1e-6, "{vouched:?}");
    assert!(!vouched.drifted, "{vouched:?}");
    // The embedder agrees it is off topic: drift.
    let agreed = with(Some(0.05));
    assert!(agreed.drifted, "{agreed:?}");
    assert_eq!(agreed.relevance, lexical.relevance.max(0.05));
    // Unusable values are ignored; out-of-range ones clamped.
    assert_eq!(with(Some(f32::NAN)), lexical);
    assert_eq!(with(Some(7.0)).relevance, 1.0);
}

#[test]
fn low_semantic_similarity_does_not_override_lexical_evidence() {
    let steps = foundry_short();
    let report = assess(
        &DriftInput {
            semantic: Some(0.1),
            ..input(GOAL, &steps)
        },
        &DriftSettings::default(),
    );
    assert!(!report.drifted, "{report:?}");
    assert_eq!(report.relevance, judge(GOAL, &steps).relevance);
}

#[test]
fn paraphrased_on_track_trace_needs_the_embedder() {
    // No shared words with the goal: lexical relevance cannot see it.
    let steps = trace(vec![
        step(
            "mes.output",
            r#"{"unit":"melt-2"}"#,
            "melt shop unit two: 14 charges poured",
        ),
        step(
            "mes.downtime",
            r#"{"unit":"melt-2"}"#,
            "two unplanned stops",
        ),
        step(
            "mes.output",
            r#"{"unit":"melt-2","shift":"night"}"#,
            "4 charges poured",
        ),
    ]);
    assert!(judge(GOAL, &steps).drifted);
    let report = assess(
        &DriftInput {
            semantic: Some(0.7),
            ..input(GOAL, &steps)
        },
        &DriftSettings::default(),
    );
    assert!(!report.drifted, "{report:?}");
}

#[test]
fn fewer_than_two_steps_never_flag() {
    let unrelated = trace(vec![step(
        "hr.payroll",
        r#"{"employee":"Maria Keller"}"#,
        "Gross salary 4,250.00 EUR",
    )]);
    for steps in [&unrelated[..0], &unrelated[..]] {
        let report = judge(GOAL, steps);
        assert!(!report.drifted, "{report:?}");
        assert!(report.reason.starts_with("too early"), "{}", report.reason);
    }
    // The single unrelated step still scores low: only the verdict waits.
    assert!(judge(GOAL, &unrelated).score < 0.35);
    // Two unrelated steps are enough evidence.
    let two = trace(vec![
        unrelated[0].clone(),
        step(
            "weather.forecast",
            r#"{"city":"Duisburg"}"#,
            "rain, 12 degrees",
        ),
    ]);
    assert!(judge(GOAL, &two).drifted);
}

#[test]
fn window_setting_limits_what_relevance_sees() {
    let steps = wandering();
    let wide = DriftSettings {
        window: 7,
        ..DriftSettings::default()
    };
    let narrow = DriftSettings {
        window: 2,
        ..DriftSettings::default()
    };
    let wide = assess(&input(GOAL, &steps), &wide);
    let narrow = assess(&input(GOAL, &steps), &narrow);
    assert!(wide.relevance > narrow.relevance, "{wide:?} vs {narrow:?}");
    assert!(!narrow.reason.contains("hr.payroll,"), "{}", narrow.reason);
    assert!(narrow.reason.contains("crm.leads"), "{}", narrow.reason);
}

#[test]
fn window_text_holds_the_recent_steps_only() {
    let steps = wandering();
    let text = window_text(&steps, 2);
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(
        text.contains("crm leads region north status open"),
        "{text}"
    );
    assert!(
        text.contains("hr vacation balance employee Maria Keller"),
        "{text}"
    );
    assert!(text.contains("11 vacation days left"), "{text}");
    assert!(!text.contains("payroll"), "{text}");
    assert_eq!(window_text(&[], 4), "");
    // Window 0 acts as 1.
    assert_eq!(window_text(&steps, 0).lines().count(), 1);
}

#[test]
fn lexical_similarity_matches_inflections_and_ignores_stopwords() {
    let on = lexical_similarity(GOAL, "plant batches furnace id F2 -> F2 restarted twice");
    let off = lexical_similarity(GOAL, "hr payroll employee Maria Keller -> salary 4250 EUR");
    assert!(on > 0.8, "{on}");
    assert!(off < 0.05, "{off}");
    assert_eq!(lexical_similarity(GOAL, "how were there any of the"), 0.0);
    assert_eq!(lexical_similarity("", "batches"), 0.0);
    assert_eq!(lexical_similarity(GOAL, ""), 0.0);
    for text in ["F2", "batch", GOAL, "Batches! RESTARTS? furnace-F2"] {
        let s = lexical_similarity(GOAL, text);
        assert!((0.0..=1.0).contains(&s), "{text}: {s}");
    }
    assert_eq!(lexical_similarity(GOAL, GOAL), 1.0);
}

#[test]
fn failed_calls_count_as_attempts() {
    let failing = |n: u32| StepTrace {
        ok: false,
        ..step(
            "hr.payroll",
            &format!(r#"{{"employee":"E-{n}"}}"#),
            "permission denied",
        )
    };
    let mut steps = foundry_short();
    steps.extend([failing(1), failing(2), failing(3), failing(4)]);
    let report = judge(GOAL, &trace(steps));
    assert!(report.drifted, "{report:?}");
    assert!(report.reason.contains("hr.payroll"), "{}", report.reason);
}
