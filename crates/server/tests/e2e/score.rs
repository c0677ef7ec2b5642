//! `/v1/score` and `/v1/rerank` (also `/rerank`, `/v2/rerank`) on the all-MiniLM-L6-v2 server of
//! `embeddings.rs`: each score is the cosine of the two texts' embeddings as `/v1/embeddings`
//! gives them, rerank results come sorted with their document indices, `top_n` and
//! `return_documents` are honoured, and bad requests are 400s naming the field.

use anyhow::Result;
use serde_json::{json, Value};

use crate::embeddings::server;
use crate::harness::{assert_error_shape, client, post_json, shared};

const QUERY: &str = "What is the capital of France?";
const DOCUMENTS: [&str; 4] = [
    "I love eating pizza with extra cheese on Friday nights.",
    "Paris is the capital and most populous city of France.",
    "The mitochondria is the powerhouse of the cell.",
    "France's capital city, Paris, lies on the Seine.",
];

async fn embeddings(texts: &[&str]) -> Result<Vec<Vec<f64>>> {
    let (status, body) =
        post_json(&client(), &server().url("/v1/embeddings"), &json!({"input": texts})).await?;
    assert_eq!(status, 200, "{body}");
    Ok(body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect())
        .collect())
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

#[tokio::test]
async fn scores_are_the_cosines_of_the_embeddings() -> Result<()> {
    let mut texts = vec![QUERY];
    texts.extend(DOCUMENTS);
    let vectors = embeddings(&texts).await?;
    let url = server().url("/v1/score");
    let (status, body) = post_json(&client(), &url, &json!({"text_1": QUERY, "text_2": DOCUMENTS})).await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "list");
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), 4);
    for (i, d) in data.iter().enumerate() {
        assert_eq!((d["index"].as_u64(), d["object"].as_str()), (Some(i as u64), Some("score")));
        let want = cosine(&vectors[0], &vectors[i + 1]);
        assert!((d["score"].as_f64().unwrap() - want).abs() < 1e-5, "{i}: {d} vs {want}");
    }
    assert!(body["usage"]["prompt_tokens"].as_u64().unwrap() > 4 * 5);
    // Pair by pair: two lists of the same length.
    let pairs = json!({"text_1": [DOCUMENTS[1], DOCUMENTS[0]], "text_2": [DOCUMENTS[3], DOCUMENTS[2]]});
    let (status, body) = post_json(&client(), &url, &pairs).await?;
    assert_eq!(status, 200, "{body}");
    let first = body["data"][0]["score"].as_f64().unwrap();
    assert!((first - cosine(&vectors[2], &vectors[4])).abs() < 1e-5, "{body}");
    assert!(first > body["data"][1]["score"].as_f64().unwrap(), "related texts score higher: {body}");
    Ok(())
}

#[tokio::test]
async fn rerank_sorts_the_documents_on_every_route() -> Result<()> {
    for route in ["/v1/rerank", "/rerank", "/v2/rerank"] {
        let body = json!({"model": "smol", "query": QUERY, "documents": DOCUMENTS});
        let (status, reply) = post_json(&client(), &server().url(route), &body).await?;
        assert_eq!(status, 200, "{route}: {reply}");
        let results = reply["results"].as_array().unwrap();
        let mut indices: Vec<u64> = results.iter().map(|r| r["index"].as_u64().unwrap()).collect();
        let scores: Vec<f64> = results.iter().map(|r| r["relevance_score"].as_f64().unwrap()).collect();
        assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{route}: sorted: {reply}");
        assert!(
            [1, 3].contains(&indices[0]) && [1, 3].contains(&indices[1]),
            "{route}: Paris first: {reply}"
        );
        assert_eq!(results[0]["document"]["text"], DOCUMENTS[indices[0] as usize], "{route}");
        indices.sort_unstable();
        assert_eq!(indices, [0, 1, 2, 3], "{route}");
        assert!(reply["usage"]["total_tokens"].as_u64().unwrap() > 0);
    }
    let body = json!({"query": QUERY, "documents": DOCUMENTS, "top_n": 2, "return_documents": false});
    let (status, reply) = post_json(&client(), &server().url("/v1/rerank"), &body).await?;
    assert_eq!(status, 200, "{reply}");
    let results = reply["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{reply}");
    assert!(results.iter().all(|r| r.get("document").is_none()), "{reply}");
    Ok(())
}

#[tokio::test]
async fn bad_score_and_rerank_requests_are_400s() -> Result<()> {
    let cases: [(&str, Value, &str); 5] = [
        ("/v1/score", json!({"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}), "text_2"),
        ("/v1/score", json!({"text_1": [], "text_2": "x"}), "text_1"),
        ("/v1/score", json!({"text_1": "a", "text_2": "b", "temperature": 1}), "temperature"),
        ("/v1/rerank", json!({"query": "q", "documents": []}), "documents"),
        ("/v1/rerank", json!({"query": "q", "documents": ["a"], "top_n": -1}), "top_n"),
    ];
    for (route, body, param) in cases {
        let (status, reply) = post_json(&client(), &server().url(route), &body).await?;
        assert_eq!(status, 400, "{route} {body}: {reply}");
        assert_eq!(assert_error_shape(&reply)["param"], param, "{route} {body}: {reply}");
    }
    let (status, reply) = post_json(&client(), &server().url("/v1/rerank"), &json!({"query": "q"})).await?;
    assert_eq!(status, 400, "{reply}");
    assert!(assert_error_shape(&reply)["message"].as_str().unwrap().contains("documents"), "{reply}");
    // A model that does not embed cannot score.
    let (status, reply) =
        post_json(&client(), &shared().url("/v1/rerank"), &json!({"query": "q", "documents": ["a"]})).await?;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(assert_error_shape(&reply)["param"], "model", "{reply}");
    Ok(())
}
