//! Unit tests for the SentencePiece merge derivation and Gemma's respelling.

use super::*;

fn pairs(merges: &[(String, String)]) -> Vec<(&str, &str)> {
    merges.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect()
}

#[test]
fn merges_are_ranked_by_score_then_longer_left_then_longer_right() {
    //            0    1    2    3     4     5      6
    let tokens = ["a", "b", "c", "ab", "bc", "abc", "ca"];
    let scores = [0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -0.5];
    let merges = derive_merges(&tokens, Some(&scores));
    // "ca" (-0.5) before "ab" (-1) before "bc" (-2); "abc" (-3) cuts as ab|c and a|bc, the longer
    // left part first.
    assert_eq!(pairs(&merges), vec![("c", "a"), ("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc")]);
}

#[test]
fn without_scores_lower_ids_rank_first() {
    let tokens = ["a", "b", "c", "bc", "ab", "abc"];
    let merges = derive_merges(&tokens, None);
    assert_eq!(pairs(&merges), vec![("b", "c"), ("a", "b"), ("ab", "c"), ("a", "bc")]);
}

#[test]
fn ties_keep_vocabulary_order_and_part_ids() {
    // Equal scores and lengths: first-appearance order of the merged piece decides.
    let tokens = ["x", "y", "z", "zy", "xy", "yx"];
    let merges = derive_merges(&tokens, Some(&[0.0; 6]));
    assert_eq!(pairs(&merges), vec![("z", "y"), ("x", "y"), ("y", "x")]);
}

#[test]
fn cuts_fall_on_character_boundaries() {
    let tokens = ["é", "▁", "▁é", "日本", "日", "本"];
    let merges = derive_merges(&tokens, Some(&[0.0, 0.0, -1.0, -2.0, 0.0, 0.0]));
    assert_eq!(pairs(&merges), vec![("▁", "é"), ("日", "本")]);
}

#[test]
fn nan_and_negative_zero_scores_sort_sanely() {
    let tokens = ["a", "b", "ab", "ba", "aa"];
    let merges = derive_merges(&tokens, Some(&[0.0, 0.0, f64::NAN, -0.0, 0.0]));
    // -0.0 ties with 0.0 (order of appearance); NaN goes last.
    assert_eq!(pairs(&merges), vec![("b", "a"), ("a", "a"), ("a", "b")]);
}

#[test]
fn only_space_runs_are_respelled() {
    assert_eq!(respell_spaces("   "), "▁▁▁");
    assert_eq!(respell_spaces(" "), "▁");
    assert_eq!(respell_spaces("\n\n"), "\n\n");
    assert_eq!(respell_spaces("\t"), "\t");
    assert_eq!(respell_spaces(" a"), " a");
    assert!(matches!(respell_spaces("▁x"), Cow::Borrowed(_)));
}
