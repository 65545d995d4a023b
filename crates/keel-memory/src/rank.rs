//! Turning text and vector candidate lists into one ranking: weighted
//! score fusion, time decay, and MMR re-ranking.
//!
//! Fusion works on scores in [0, 1]: BM25 scores divided by the best BM25
//! score of the query, cosine similarities clipped at 0. A weighted sum keeps
//! how strong a match is, which pure rank fusion (RRF) throws away: with RRF
//! a chunk sharing only one common word with the query would tie a true
//! semantic match of the same rank.

use std::collections::HashMap;

/// Weighted fusion of scored candidate lists. Each list is `(hits, weight)`
/// with hits `(id, score in [0, 1])`; an id missing from a list scores 0
/// there. Returns `(id, fused score)` best first; the fused score is the
/// weighted mean over the lists given, so it stays in [0, 1].
pub fn fuse(lists: &[(&[(i64, f32)], f32)]) -> Vec<(i64, f32)> {
    let total: f32 = lists.iter().map(|(_, w)| w.max(0.0)).sum();
    if total <= 0.0 {
        return Vec::new();
    }
    let mut scores: HashMap<i64, f32> = HashMap::new();
    for (hits, weight) in lists {
        for (id, score) in hits.iter() {
            *scores.entry(*id).or_default() += weight.max(0.0) * score.clamp(0.0, 1.0);
        }
    }
    let mut out: Vec<(i64, f32)> = scores.into_iter().map(|(id, s)| (id, s / total)).collect();
    sort_desc(&mut out);
    out
}

/// Scales scores (higher is better) so that the best is 1.0.
pub fn scale_to_best(hits: &mut [(i64, f32)]) {
    let best = hits.iter().map(|h| h.1).fold(0.0_f32, f32::max);
    if best > 0.0 {
        for h in hits {
            h.1 /= best;
        }
    }
}

/// Score multiplier for a note `age_days` old: halves every `half_life_days`;
/// 1.0 when decay is off (`half_life_days <= 0`) or for future dates.
pub fn decay(age_days: f64, half_life_days: f64) -> f32 {
    if half_life_days <= 0.0 || age_days <= 0.0 {
        return 1.0;
    }
    0.5_f64.powf(age_days / half_life_days) as f32
}

/// Maximal marginal relevance: picks `k` of `candidates` (id, relevance),
/// each time the one maximizing `λ·relevance − (1−λ)·max similarity to
/// those already picked`, so near-duplicates do not crowd out other facts.
/// `similarity(a, b)` is in [0, 1]. Returns the picks in order, with their
/// relevance (not the MMR objective) as score.
pub fn mmr(
    candidates: &[(i64, f32)],
    k: usize,
    lambda: f32,
    similarity: impl Fn(i64, i64) -> f32,
) -> Vec<(i64, f32)> {
    let top = candidates.iter().map(|c| c.1).fold(f32::MIN, f32::max);
    let norm = if top > 0.0 { top } else { 1.0 };
    // Each candidate with its largest similarity to the picks so far,
    // updated with the latest pick only: k·n similarities, not k²·n.
    let mut left: Vec<((i64, f32), f32)> = candidates.iter().map(|c| (*c, 0.0)).collect();
    let mut picked: Vec<(i64, f32)> = Vec::with_capacity(k.min(left.len()));
    while picked.len() < k && !left.is_empty() {
        if let Some(&(last, _)) = picked.last() {
            for ((id, _), redundancy) in &mut left {
                *redundancy = redundancy.max(similarity(*id, last));
            }
        }
        let mut best = (0, f32::MIN);
        for (i, ((_, rel), redundancy)) in left.iter().enumerate() {
            let value = lambda * (rel / norm) - (1.0 - lambda) * redundancy;
            if value > best.1 {
                best = (i, value);
            }
        }
        picked.push(left.remove(best.0).0);
    }
    picked
}

/// Dot product; equal to cosine similarity for unit vectors.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent accumulators let the compiler vectorize the loop.
    let mut acc = [0.0_f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// `v` scaled to unit length (unchanged if it is all zeros).
pub fn normalize(mut v: Vec<f32>) -> Vec<f32> {
    let norm = dot(&v, &v).sqrt();
    if norm > 0.0 {
        for x in &mut v {
            *x /= norm;
        }
    }
    v
}

/// Jaccard similarity of the lowercase word sets of two texts: MMR's
/// redundancy measure when there are no vectors.
pub fn word_overlap(a: &str, b: &str) -> f32 {
    use std::collections::HashSet;
    let set = |s: &str| -> HashSet<String> {
        s.split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .collect()
    };
    let (x, y) = (set(a), set(b));
    let union = x.union(&y).count();
    if union == 0 {
        return 0.0;
    }
    x.intersection(&y).count() as f32 / union as f32
}

pub(crate) fn sort_desc(v: &mut [(i64, f32)]) {
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fusion_weighs_lists_and_keeps_strength() {
        let text = [(1, 1.0), (2, 0.5)];
        let vector = [(3, 0.9), (1, 0.2)];
        let fused = fuse(&[(&text, 0.3), (&vector, 0.7)]);
        let order: Vec<i64> = fused.iter().map(|x| x.0).collect();
        // 3: 0.63, 1: 0.3 + 0.14 = 0.44, 2: 0.15.
        assert_eq!(order, [3, 1, 2]);
        assert!((fused[0].1 - 0.63).abs() < 1e-5);
        assert!((fused[1].1 - 0.44).abs() < 1e-5);
        // Text only: scores are the text scores.
        let fused = fuse(&[(&text, 0.3)]);
        assert_eq!(fused, vec![(1, 1.0), (2, 0.5)]);
        // Negative cosines do not push a text hit below zero.
        let fused = fuse(&[(&[(5, 1.0)], 1.0), (&[(5, -0.8)], 1.0)]);
        assert!((fused[0].1 - 0.5).abs() < 1e-6);
    }

    #[test]
    fn fusion_of_nothing_is_empty() {
        assert!(fuse(&[(&[], 1.0), (&[], 1.0)]).is_empty());
        assert!(fuse(&[(&[(1, 1.0)], 0.0)]).is_empty());
        let mut hits = vec![(1, 4.0), (2, 1.0)];
        scale_to_best(&mut hits);
        assert_eq!(hits, vec![(1, 1.0), (2, 0.25)]);
    }

    #[test]
    fn decay_halves_per_half_life() {
        assert_eq!(decay(10.0, 0.0), 1.0);
        assert_eq!(decay(-3.0, 30.0), 1.0);
        assert!((decay(30.0, 30.0) - 0.5).abs() < 1e-6);
        assert!((decay(60.0, 30.0) - 0.25).abs() < 1e-6);
        assert!(decay(1.0, 30.0) > decay(2.0, 30.0));
    }

    #[test]
    fn mmr_skips_near_duplicates() {
        // 1 and 2 are duplicates; 3 is a bit less relevant but different.
        let candidates = [(1, 1.0), (2, 0.99), (3, 0.8)];
        let sim = |a: i64, b: i64| if a + b == 3 { 1.0 } else { 0.0 };
        let picked = mmr(&candidates, 2, 0.7, sim);
        assert_eq!(picked.iter().map(|p| p.0).collect::<Vec<_>>(), [1, 3]);
        // λ = 1 is pure relevance.
        let picked = mmr(&candidates, 2, 1.0, sim);
        assert_eq!(picked.iter().map(|p| p.0).collect::<Vec<_>>(), [1, 2]);
        // Never more than asked, nor than there is.
        assert_eq!(mmr(&candidates, 10, 0.7, sim).len(), 3);
        assert!(mmr(&candidates, 0, 0.7, sim).is_empty());
    }

    /// The picks are those of the textbook definition, which recomputes
    /// every candidate's redundancy against every pick each round.
    #[test]
    fn mmr_matches_the_quadratic_definition() {
        let reference =
            |candidates: &[(i64, f32)], k: usize, lambda: f32, sim: &dyn Fn(i64, i64) -> f32| {
                let norm = candidates.iter().map(|c| c.1).fold(f32::MIN, f32::max);
                let mut left = candidates.to_vec();
                let mut picked: Vec<(i64, f32)> = Vec::new();
                while picked.len() < k && !left.is_empty() {
                    let mut best = (0, f32::MIN);
                    for (i, (id, rel)) in left.iter().enumerate() {
                        let redundancy =
                            picked.iter().map(|(p, _)| sim(*id, *p)).fold(0.0, f32::max);
                        let value = lambda * (rel / norm) - (1.0 - lambda) * redundancy;
                        if value > best.1 {
                            best = (i, value);
                        }
                    }
                    picked.push(left.remove(best.0));
                }
                picked
            };
        let candidates: Vec<(i64, f32)> = (0..40)
            .map(|i| (i, 1.0 - ((i * 37) % 40) as f32 / 50.0))
            .collect();
        // A similarity with structure: ids close in value (mod 7) are alike.
        let sim = |a: i64, b: i64| 1.0 / (1.0 + ((a % 7) - (b % 7)).abs() as f32);
        for lambda in [0.3, 0.5, 0.7, 1.0] {
            for k in [1, 5, 12, 40] {
                assert_eq!(
                    mmr(&candidates, k, lambda, sim),
                    reference(&candidates, k, lambda, &sim),
                    "λ={lambda} k={k}"
                );
            }
        }
    }

    #[test]
    fn vector_helpers() {
        let v = normalize(vec![3.0, 4.0]);
        assert!((v[0] - 0.6).abs() < 1e-6 && (v[1] - 0.8).abs() < 1e-6);
        let a: Vec<f32> = (0..19).map(|i| i as f32).collect();
        let expected: f32 = a.iter().map(|x| x * x).sum();
        assert!((dot(&a, &a) - expected).abs() < 1e-3);
        assert_eq!(normalize(vec![0.0, 0.0]), vec![0.0, 0.0]);
        assert!((word_overlap("Furnace F2 hot", "furnace f2 cold") - 0.5).abs() < 1e-6);
        assert_eq!(word_overlap("", ""), 0.0);
    }
}
