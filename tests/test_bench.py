"""The benchmark command runs end to end and reports what it promises (no speed asserts)."""

import json
import subprocess
import sys

from gguf import GGUFReader


def test_bench_reports_speed_memory_and_bandwidth(reference_dir):
    model = reference_dir / "tiny-smollm3-Q4_K_M.gguf"
    cmd = [sys.executable, "-m", "llm_smolq.dev.bench", str(model), "--threads", "2", "--prefill", "16",
           "--decode", "4", "--repeat", "2", "--json", "--schema"]
    report = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    ours = report["engines"]["llm-smolq"]
    for key in ("prefill_tok_s", "decode_tok_s", "load_s", "peak_rss_mb", "schema_ms_per_token",
                "schema_pct_of_decode"):
        assert 0 < ours[key]["min"] <= ours[key]["median"] <= ours[key]["max"]
    # Tied embeddings: a decode step reads every tensor once (token_embd as the output).
    assert report["weight_bytes_per_token"] == sum(t.n_bytes for t in GGUFReader(model).tensors)
    assert report["machine_read_gb_s"] > 0 and ours["decode_gb_s"] > 0
