//! Serving metrics with vLLM's names under a `deepinfer:` prefix, so dashboards built for
//! `vllm:*` work after a rename. The engine thread records them (it sees every scheduling
//! and sampling event); the server renders them at `/metrics`.
//!
//! Each engine has its own registry (no global recorder), so several engines in one process
//! (tests, benchmarks) never mix their numbers.

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};
use std::time::Duration;

use crate::cache::disk::DiskStats;
use crate::cache::PoolUsage;
use crate::request::FinishReason;

/// Latency buckets in seconds, from vLLM's TTFT/E2E histograms (ms-scale to minutes).
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// Inter-token latency buckets in seconds (vLLM's ITL histogram).
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// Token-count buckets (1, 2, 5 per decade), as vLLM builds them up to the context length.
const TOKEN_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0,
    50000.0, 100000.0, 200000.0, 500000.0, 1000000.0,
];

/// Tokens per engine step (vLLM's `iteration_tokens_total` buckets).
const STEP_TOKEN_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];

pub struct EngineMetrics {
    registry: Registry,
    /// Tokens per engine step; its count is the number of steps.
    pub iteration_tokens: Histogram,
    /// Each request's latencies and lengths.
    pub requests: RequestMetrics,
    pub prompt_tokens: IntCounter,
    pub generation_tokens: IntCounter,
    pub num_preemptions: IntCounter,
    /// Structured outputs: masks computed (one per sampled row of a constrained sequence)
    /// and the time per step spent computing them, beside the forward pass.
    pub structured_output_masks: IntCounter,
    pub structured_output_mask_time: Histogram,
    /// Prefix caching (vLLM's names): prompt tokens looked up at admission, and found.
    pub prefix_cache_queries: IntCounter,
    pub prefix_cache_hits: IntCounter,
    /// The prefix cache's disk tier (`--prefix-cache-dir`).
    pub prefix_disk: DiskMetrics,
    /// Speculative decoding (vLLM's names): verify rounds (one per sequence and step with
    /// drafts), draft tokens verified, accepted, and accepted by draft position.
    pub spec_decode_num_drafts: IntCounter,
    pub spec_decode_num_draft_tokens: IntCounter,
    pub spec_decode_num_accepted_tokens: IntCounter,
    spec_decode_accepted_per_pos: IntCounterVec,
    request_success: IntCounterVec,
    pub num_requests_running: IntGauge,
    pub num_requests_waiting: IntGauge,
    cache_usage: prometheus::GaugeVec,
}

/// Per request (vLLM's request histograms): observed at its first token, between tokens and
/// when it finishes.
pub struct RequestMetrics {
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    pub request_time_per_output_token: Histogram,
    pub e2e_request_latency: Histogram,
    pub request_queue_time: Histogram,
    pub request_prompt_tokens: Histogram,
    pub request_generation_tokens: Histogram,
}

/// The disk tier's counters: its hits under vLLM's names for hits from outside the GPU
/// cache (`external_prefix_cache_*`, which its KV connectors such as LMCache's disk offload
/// fill), and its traffic.
pub struct DiskMetrics {
    pub queries: IntCounter,
    pub hits: IntCounter,
    pub read_bytes: IntCounter,
    pub written_bytes: IntCounter,
    pub dropped_writes: IntCounter,
    pub errors: IntCounter,
    pub entries: IntGauge,
    pub bytes: IntGauge,
}

/// Makes series named `deepinfer:{name}` and registers them in one registry.
struct Reg<'a>(&'a Registry);

impl Reg<'_> {
    fn add<M: prometheus::core::Collector + Clone + 'static>(&self, m: M) -> M {
        self.0.register(Box::new(m.clone())).expect("unique name");
        m
    }

    fn histogram(&self, name: &str, help: &str, buckets: &[f64]) -> Histogram {
        let opts = HistogramOpts::new(format!("deepinfer:{name}"), help).buckets(buckets.to_vec());
        self.add(Histogram::with_opts(opts).expect("valid histogram"))
    }

    fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.add(IntCounter::new(format!("deepinfer:{name}"), help).expect("valid counter"))
    }

    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.add(IntGauge::new(format!("deepinfer:{name}"), help).expect("valid gauge"))
    }

    fn counters(&self, name: &str, help: &str, label: &str) -> IntCounterVec {
        let opts = Opts::new(format!("deepinfer:{name}"), help);
        self.add(IntCounterVec::new(opts, &[label]).expect("valid counter"))
    }

    fn gauges(&self, name: &str, help: &str, label: &str) -> prometheus::GaugeVec {
        let opts = Opts::new(format!("deepinfer:{name}"), help);
        self.add(prometheus::GaugeVec::new(opts, &[label]).expect("valid gauge"))
    }
}

impl RequestMetrics {
    fn new(r: &Reg) -> Self {
        Self {
            time_to_first_token: r.histogram(
                "time_to_first_token_seconds",
                "Time from arrival to the first output token.",
                LATENCY_BUCKETS,
            ),
            inter_token_latency: r.histogram(
                "inter_token_latency_seconds",
                "Time between consecutive output tokens of a request.",
                ITL_BUCKETS,
            ),
            request_time_per_output_token: r.histogram(
                "request_time_per_output_token_seconds",
                "Per request: decode time divided by output tokens after the first (TPOT).",
                ITL_BUCKETS,
            ),
            e2e_request_latency: r.histogram(
                "e2e_request_latency_seconds",
                "Time from arrival to the last output token.",
                LATENCY_BUCKETS,
            ),
            request_queue_time: r.histogram(
                "request_queue_time_seconds",
                "Time from arrival to the first scheduled step.",
                LATENCY_BUCKETS,
            ),
            request_prompt_tokens: r.histogram(
                "request_prompt_tokens",
                "Prompt length of finished requests.",
                TOKEN_BUCKETS,
            ),
            request_generation_tokens: r.histogram(
                "request_generation_tokens",
                "Output length of finished requests.",
                TOKEN_BUCKETS,
            ),
        }
    }
}

impl DiskMetrics {
    fn new(r: &Reg) -> Self {
        Self {
            queries: r.counter(
                "external_prefix_cache_queries_total",
                "Prompt tokens looked up in the prefix cache on disk (past the memory hit).",
            ),
            hits: r.counter(
                "external_prefix_cache_hits_total",
                "Prompt tokens found in the prefix cache on disk.",
            ),
            read_bytes: r.counter(
                "prefix_cache_disk_read_bytes_total",
                "Bytes of prefix cache entries read from disk.",
            ),
            written_bytes: r.counter(
                "prefix_cache_disk_written_bytes_total",
                "Bytes of prefix cache entries written to disk.",
            ),
            dropped_writes: r.counter(
                "prefix_cache_disk_dropped_writes_total",
                "Entries not written because the write queue was full.",
            ),
            errors: r.counter(
                "prefix_cache_disk_errors_total",
                "Failed disk writes and entries found corrupt, torn or foreign.",
            ),
            entries: r.gauge(
                "prefix_cache_disk_entries",
                "Entries in the prefix cache directory.",
            ),
            bytes: r.gauge(
                "prefix_cache_disk_bytes",
                "Bytes in the prefix cache directory.",
            ),
        }
    }
}

impl EngineMetrics {
    /// Every series carries `model_name`, as vLLM's do.
    pub fn new(model_name: &str) -> Self {
        let registry = Registry::new_custom(
            None,
            Some([("model_name".into(), model_name.into())].into()),
        )
        .expect("a constant label with a valid name");
        let r = Reg(&registry);
        Self {
            iteration_tokens: r.histogram(
                "iteration_tokens_total",
                "Tokens per engine step (prefill chunks, decode and draft tokens).",
                STEP_TOKEN_BUCKETS,
            ),
            requests: RequestMetrics::new(&r),
            prompt_tokens: r.counter("prompt_tokens_total", "Prompt tokens prefilled."),
            generation_tokens: r.counter("generation_tokens_total", "Output tokens generated."),
            num_preemptions: r.counter(
                "num_preemptions_total",
                "Sequences preempted (their cache freed, recomputed later).",
            ),
            structured_output_masks: r.counter(
                "structured_output_masks_total",
                "Token masks computed for structured outputs (one per constrained row sampled).",
            ),
            structured_output_mask_time: r.histogram(
                "structured_output_mask_seconds",
                "Time per step spent computing structured-output masks, beside the forward pass.",
                LATENCY_BUCKETS,
            ),
            prefix_cache_queries: r.counter(
                "prefix_cache_queries_total",
                "Prefix cache queries, in tokens: every token of a sequence admitted.",
            ),
            prefix_cache_hits: r.counter(
                "prefix_cache_hits_total",
                "Prefix cache hits, in tokens: those found computed in the cache.",
            ),
            prefix_disk: DiskMetrics::new(&r),
            spec_decode_num_drafts: r.counter(
                "spec_decode_num_drafts_total",
                "Verify rounds: sequences that had draft tokens verified, per step.",
            ),
            spec_decode_num_draft_tokens: r.counter(
                "spec_decode_num_draft_tokens_total",
                "Draft tokens verified.",
            ),
            spec_decode_num_accepted_tokens: r.counter(
                "spec_decode_num_accepted_tokens_total",
                "Draft tokens accepted.",
            ),
            spec_decode_accepted_per_pos: r.counters(
                "spec_decode_num_accepted_tokens_per_pos_total",
                "Accepted draft tokens, by position in the draft (0 = first).",
                "position",
            ),
            request_success: r.counters(
                "request_success_total",
                "Finished requests, by finish reason.",
                "finished_reason",
            ),
            num_requests_running: r.gauge(
                "num_requests_running",
                "Requests holding a cache and being stepped.",
            ),
            num_requests_waiting: r.gauge("num_requests_waiting", "Requests queued for admission."),
            cache_usage: r.gauges(
                "kv_cache_usage_perc",
                "Share of each cache pool in use (1 = full).",
                "pool",
            ),
            registry,
        }
    }

    /// One sequence's verify round: `drafted` draft tokens, of which the first `accepted`
    /// were accepted.
    pub fn spec_decode_round(&self, drafted: usize, accepted: usize) {
        self.spec_decode_num_drafts.inc();
        self.spec_decode_num_draft_tokens.inc_by(drafted as u64);
        self.spec_decode_num_accepted_tokens.inc_by(accepted as u64);
        for pos in POSITION_LABELS.iter().take(accepted) {
            self.spec_decode_accepted_per_pos
                .with_label_values(&[pos])
                .inc();
        }
    }

    /// Accepted draft tokens at `position` so far.
    pub fn spec_decode_accepted_at(&self, position: usize) -> u64 {
        POSITION_LABELS.get(position).map_or(0, |p| {
            self.spec_decode_accepted_per_pos
                .with_label_values(&[p])
                .get()
        })
    }

    pub fn request_finished(&self, reason: FinishReason) {
        self.request_success
            .with_label_values(&[reason.as_str()])
            .inc();
    }

    /// Brings the disk tier's series up to `stats`.
    pub fn set_disk(&self, stats: &DiskStats) {
        let m = &self.prefix_disk;
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        for (c, a) in [
            (&m.queries, &stats.query_tokens),
            (&m.hits, &stats.hit_tokens),
            (&m.read_bytes, &stats.read_bytes),
            (&m.written_bytes, &stats.written_bytes),
            (&m.dropped_writes, &stats.dropped_writes),
            (&m.errors, &stats.errors),
        ] {
            c.inc_by(load(a).saturating_sub(c.get()));
        }
        m.entries.set(load(&stats.entries) as i64);
        m.bytes.set(load(&stats.bytes) as i64);
    }

    pub fn set_cache_usage(&self, pools: impl IntoIterator<Item = PoolUsage>) {
        for p in pools {
            let perc = if p.total_blocks == 0 {
                0.0
            } else {
                p.used_blocks as f64 / p.total_blocks as f64
            };
            self.cache_usage.with_label_values(&[p.name]).set(perc);
        }
    }

    /// Current usage of one pool (tests and the load test read it back).
    pub fn cache_usage(&self, pool: &str) -> f64 {
        self.cache_usage.with_label_values(&[pool]).get()
    }

    /// The Prometheus text exposition of every series.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding of gathered metrics");
        String::from_utf8(buf).expect("the text format is UTF-8")
    }
}

/// Labels of the draft positions, as static strings (no formatting per step).
const POSITION_LABELS: [&str; 16] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15",
];

pub(crate) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_vllm_names_with_the_model_label() {
        let m = EngineMetrics::new("tiny");
        m.requests.time_to_first_token.observe(0.03);
        m.prompt_tokens.inc_by(7);
        m.request_finished(FinishReason::Length);
        m.set_cache_usage([PoolUsage {
            name: "csa_entries",
            cached_blocks: 0,
            used_blocks: 1,
            total_blocks: 4,
            used_bytes: 10,
            total_bytes: 40,
        }]);
        let text = m.render();
        assert!(text.contains(
            "deepinfer:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.04\"} 1"
        ));
        assert!(text.contains("deepinfer:prompt_tokens_total{model_name=\"tiny\"} 7"));
        assert!(text.contains(
            "deepinfer:request_success_total{finished_reason=\"length\",model_name=\"tiny\"} 1"
        ));
        // The registry's constant label is appended after the series' own labels.
        assert!(text.contains(
            "deepinfer:kv_cache_usage_perc{pool=\"csa_entries\",model_name=\"tiny\"} 0.25"
        ));
        assert_eq!(m.cache_usage("csa_entries"), 0.25);
    }

    #[test]
    fn spec_decode_counters() {
        let m = EngineMetrics::new("tiny");
        m.spec_decode_round(3, 2);
        m.spec_decode_round(3, 0);
        let text = m.render();
        for line in [
            "deepinfer:spec_decode_num_drafts_total{model_name=\"tiny\"} 2",
            "deepinfer:spec_decode_num_draft_tokens_total{model_name=\"tiny\"} 6",
            "deepinfer:spec_decode_num_accepted_tokens_total{model_name=\"tiny\"} 2",
            "deepinfer:spec_decode_num_accepted_tokens_per_pos_total{position=\"1\",model_name=\"tiny\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        assert_eq!(
            (0..3)
                .map(|p| m.spec_decode_accepted_at(p))
                .collect::<Vec<_>>(),
            [1, 1, 0]
        );
    }
}
