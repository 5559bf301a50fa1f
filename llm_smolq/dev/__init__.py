"""Development tools, not used by the plugin at run time: benchmarks (`bench`, and
`follow_up_bench` behind `bench --follow-up`), synthetic models (`synth`), the GGUF fuzzer
and its mutations (`fuzz_gguf`, `gguf_mutations`) and the answer survey (`answer_survey`).
They run as `python -m llm_smolq.dev.bench`, `python -m llm_smolq.dev.synth`,
`python -m llm_smolq.dev.fuzz_gguf` and `python -m llm_smolq.dev.answer_survey`; the README
and BENCHMARKS.md show them in use."""
