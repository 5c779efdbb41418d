#!/usr/bin/env bash
# One self-contained call on the GPU machine: install, test, sanitize, sweep, benchmark.
# Usage (on the device, from the repo root): bash benchmarks/device_run.sh [steps...]
# Steps: triton-a triton-b tests sanitizer sweep envab patchab intdecode narrow stride fp8sweep splits regs-decode splits-len warps fp8choice fp8short wsparts overhead hostcost hostcost-ab residency residency-toggle residency-warps indexer indexer-fp8dot indexer-tiles indexer-heads indexer-heads-tiles indexer-env indexer-ncu ncu ppc ppncu nbprobe vllmtests mid grid gatherl2 splitn splitlat splitprobe exchange apart racecheck racecheck-producer wide latency toggle targets bench prefill (default: tests sanitizer sweep bench
# prefill). toggle and residency-toggle time a boolean TileConfig field off and on, named by
# $TOGGLE (e.g. TOGGLE=prefetch_idx), on the workloads of one row format if $TOGGLE_FMT is set
# (e.g. TOGGLE_FMT=fp8_ds_mla) and of the head counts in $TOGGLE_HEADS (toggle only; e.g.
# TOGGLE_HEADS=64,128), with $TOGGLE_BASE set in both variants (toggle only; e.g.
# TOGGLE_BASE=exchange_p); with $TOGGLE set, stride times that field off
# and on at strides 656 and 768. bench (decode) and prefill benchmark the preset in $BENCH_PRESET (default all;
# its rows are heated 2 s each since bench.HEAT_S, so one preset per call if all runs long); prefill
# takes its token counts from $PREFILL_TOKENS (default 4096,16384; ShardQ's shapes: 512,2048);
# both take the row formats from $BENCH_FORMATS (e.g. fp8_ds_mla; default both) and skip the
# PyTorch baseline if $BENCH_NO_TORCH is set. tests stops at $TESTS_S seconds (default 560).
# fp8choice times ShardQ's calls (512 and 2048 tokens, 64 and 128 heads) with CHOICE_SHARDQ=1.
# Logs and JSON go to $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src
fi
# $EXTRA_SITE: a folder of packages put first (e.g. another Triton unpacked there by the steps
# triton-a and triton-b; its backends then come from its own folder: the machine's Triton
# registers an AMD backend as an entry point, which the stripped copy lacks).
export PYTHONPATH=${EXTRA_SITE:+$EXTRA_SITE:}$PYTHONPATH
[ -n "${EXTRA_SITE:-}" ] && export TRITON_BACKENDS_IN_TREE=1
# The carried copy leaves out the Blackwell ptxas; Triton 3.8 asks for it to compile for sm100
# and sm120 (the portability tests), 3.9 for every target, so point it at the copy's own ptxas
# (as run 250 did by hand; a normal install has both). Set before the copy exists, as when
# triton-b unpacks it in the same call: run 376's three portability failures were this.
xb=${EXTRA_SITE:-}; xb=${xb%%:*}/triton/backends/nvidia/bin
if [ -n "${EXTRA_SITE:-}" ] && [ ! -e "$xb/ptxas-blackwell" ]; then
  export TRITON_PTXAS_BLACKWELL_PATH=$xb/ptxas
fi
steps=${*:-tests sanitizer sweep bench prefill}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
for s in $steps; do
  echo "=== $s $(date -u +%T)"
  case $s in
    triton-a) # a Triton release packed by benchmarks/triton_carry.sh, first of two calls (carry
      # [".t38a"]): keep its first half on the machine
      mkdir -p /tmp/carry; for d in .t3*a; do cp "$d/part-00" "/tmp/carry/${d#.}"; done; ls -l /tmp/carry ;;
    triton-b) # the second call, within 30 s of the first (carry [".t38b"]): join both halves and
      # unpack them into /tmp/t38; every later call then sets EXTRA_SITE=/tmp/t38
      for d in .t3*b; do t=${d#.}; t=${t%b}; mkdir -p "/tmp/$t" &&
        cat "/tmp/carry/${t}a" "$d/part-01" | xz -d -T4 | tar x -C "/tmp/$t" &&
        PYTHONPATH="/tmp/$t" TRITON_BACKENDS_IN_TREE=1 python3 -c "import triton; print('unpacked: EXTRA_SITE=/tmp/$t, triton', triton.__version__)"; done ;;
    tests) # (SIGINT at the limit: pytest then still prints its summary, which names the failures;
      # killed, it leaves only xdist's progress line, as in run 373)
      timeout -s INT ${TESTS_S:-560} python3 -m pytest -q -n 12 -rf --tb=short tests --ignore=tests/vllm -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | tail -25 ;;
    sanitizer) timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 python3 benchmarks/sanitize_case.py 2>&1 | tee "$OUT/sanitizer.log" | tail -15 ;;
    sweep) timeout 400 python3 benchmarks/sweep.py "$OUT/sweep.json" > "$OUT/sweep.log" 2>&1; grep BEST "$OUT/sweep.log" ;;
    splits) timeout 200 python3 benchmarks/sweep.py "$OUT/sweep-splits.json" --splits 2>&1 | tee "$OUT/sweep-splits.log" | grep SPLIT ;;
    regs-decode) timeout 420 python3 benchmarks/sweep.py "$OUT/sweep-regs-decode.json" --regs-decode ${REGS_TOKENS:+--tokens $REGS_TOKENS} ${REGS_ROUNDS:+--rounds $REGS_ROUNDS} 2>&1 | tee "$OUT/sweep-regs-decode.log" | grep REGSDEC ;;
    splits-len) timeout 240 python3 benchmarks/sweep.py "$OUT/sweep-splits-len.json" --splits-len 2>&1 | tee "$OUT/sweep-splits-len.log" | grep SPLIT ;;
    splitprobe) timeout 150 python3 benchmarks/kernel_split_probe.py "$OUT/split-probe.json" 2>&1 | tee "$OUT/split-probe.log" | grep -E "PROBE|Error" ;;
    gatherl2) # the bare gather from the prefill bench's L2-resident cache (32K rows, T=4096)
      timeout 240 python3 benchmarks/gather_ceiling.py "$OUT/gather-l2.json" --rows 32768 --tokens 4096 --only ld,cp,attention 2>&1 | tee "$OUT/gather-l2.log" | grep -E "GATHER|Error" ;;
    grid) timeout 200 python3 benchmarks/narrow_grid.py "$OUT/narrow-grid.json" 2>&1 | tee "$OUT/narrow-grid.log" | grep GRID ;;
    splitn) timeout 200 python3 benchmarks/split_count.py "$OUT/split-count.json" 2>&1 | tee "$OUT/split-count.log" | grep SPLITN ;;
    splitlat) timeout 400 python3 benchmarks/split_count.py "$OUT/split-latency.json" --latency --rounds 3 2>&1 | tee "$OUT/split-latency.log" | grep SPLITN ;;
    mid) timeout 300 python3 benchmarks/mid_heads.py "$OUT/mid-heads.json" --rounds 4 2>&1 | tee "$OUT/mid-heads.log" | grep MID ;;
    fp8short) # fp8_ds_mla batches of short contexts: the workspace rule's reading of them
      timeout 240 python3 benchmarks/fp8_short_contexts.py "$OUT/fp8-short-contexts.json" 2>&1 | tee "$OUT/fp8-short-contexts.log" | grep -E "SHORT|Error" ;;
    overhead) # a prefill call's time four ways, ours and FlashMLA's (benchmarks/call_overhead.py;
      # workloads from $OVERHEAD_WORKLOADS, default ShardQ's 64-head shapes and T=4096)
      timeout 300 python3 benchmarks/call_overhead.py "$OUT/call-overhead.json" ${OVERHEAD_WORKLOADS:-} 2>&1 | tee "$OUT/call-overhead.log" | grep -E "OVERHEAD|Error" ;;
    hostcost) # host time per call, ours and FlashMLA's, and ours under cProfile (benchmarks/host_cost.py)
      timeout 200 python3 benchmarks/host_cost.py "$OUT/host-cost.json" 2>&1 | tee "$OUT/host-cost.log" | grep -E "HOST|Error" ;;
    hostcost-ab) # host time per call three ways, each its own process: the tree in $OLD_SRC (a
      # folder holding an earlier tree's src/, e.g. HEAD's from git archive), this tree with
      # kernels/launch.py's path off, and on; workloads from $HOSTCOST_SPECS (default: the
      # script's, and T=1 H=16 fp8_ds_mla decode)
      specs=${HOSTCOST_SPECS:-"1,64,bf16 1,16,fp8_ds_mla 512,64,bf16,N=32768 2048,64,fp8_ds_mla,N=32768"}
      for v in old off on; do
        case $v in old) [ -d "${OLD_SRC:-}/src" ] || continue; pp=$PWD/$OLD_SRC/src; fl=1 ;; off) pp=$PWD/src; fl=0 ;; on) pp=$PWD/src; fl=1 ;; esac
        PYTHONPATH=${PYTHONPATH/$PWD\/src/$pp} TRITON_SPARSE_MLA_FAST_LAUNCH=$fl timeout 200 python3 benchmarks/host_cost.py "$OUT/host-cost-$v.json" $specs --label "$v" 2>&1 | tee "$OUT/host-cost-$v.log" | grep -E "HOST|Error"
      done ;;
    wsparts) timeout 120 python3 benchmarks/workspace_parts.py "$OUT/workspace-parts.json" 2>&1 | tee "$OUT/workspace-parts.log" | grep PARTS ;;
    stride) timeout 240 python3 benchmarks/row_stride.py "$OUT/row-stride.json" ${TOGGLE:+--toggle $TOGGLE} 2>&1 | tee "$OUT/row-stride.log" | grep STRIDE ;;
    intdecode) # the SM80/86 e4m3 decoder, old against new, with the hardware conversion as floor
      # (benchmarks/int_decode.py; the sm80 and sm86 tiles forced to integer decoding)
      timeout 400 python3 benchmarks/int_decode.py "$OUT/int-decode.jsonl" 2>&1 | tee "$OUT/int-decode.log" | grep -v "^INTDEC" ;;
    indexer) timeout 400 python3 benchmarks/indexer_bench.py "$OUT/indexer-bench.json" 2>&1 | tee "$OUT/indexer-bench.log" | grep -E "^(prefill|decode) |Error" ;;
    indexer-fp8dot) # the indexer's fp8-tensor-core experiment (TSM_INDEXER_FP8_DOT): its tests, then
      # the bench with it off and on, each in its own process
      TSM_INDEXER_FP8_DOT=1 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_indexer.py 2>&1 | tee "$OUT/indexer-fp8dot-tests.log" | tail -3
      for v in 0 1; do TSM_INDEXER_FP8_DOT=$v timeout 200 python3 benchmarks/indexer_bench.py "$OUT/indexer-bench-fp8dot$v.json" 2>&1 | tee "$OUT/indexer-bench-fp8dot$v.log" | grep -E "^(prefill|decode) |Error" | sed "s/^/[fp8dot=$v] /"; done ;;
    indexer-tiles) # the prefill indexer's tile (TSM_INDEXER_TILE experiment), one process per tile in
      # $INDEXER_TILES (";"-separated "BLOCK_M,BLOCK_N,NUM_WARPS,NUM_STAGES", a "/0" suffix with
      # fp16 products): its tests, then the prefill rows of the bench
      IFS=';' read -ra tiles <<< "${INDEXER_TILES:-64,64,4,2;64,128,8,2}"
      for t in "${tiles[@]}"; do dot=1; [ "${t#*/}" != "$t" ] && dot=${t#*/}; tt=${t%/*}
        r=$(TSM_INDEXER_FP8_DOT=$dot TSM_INDEXER_TILE=$tt timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_indexer.py 2>&1 | tail -1)
        echo "[tile=$tt fp8dot=$dot] tests: $r"
        TSM_INDEXER_FP8_DOT=$dot TSM_INDEXER_TILE=$tt timeout 150 python3 benchmarks/indexer_bench.py "$OUT/indexer-tile-${tt//,/-}-dot$dot.json" prefill 2>&1 | tee "$OUT/indexer-tile-${tt//,/-}-dot$dot.log" | grep -E "^(prefill|decode) |Error" | sed "s/^/[tile=$tt fp8dot=$dot] /"; done ;;
    indexer-heads) # the two prefill indexer kernels (TSM_INDEXER_HEADS_ALONG_N=0: the per-head one of
      # indexer/flat.py, =1: indexer/flat_heads.py): the tests with the second forced, then the bench
      # with each, twice, each in its own process (another tile: TSM_INDEXER_HEADS_TILE=COLUMNS,BLOCK_N,WARPS,STAGES)
      TSM_INDEXER_HEADS_ALONG_N=1 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_indexer.py 2>&1 | tail -1
      for v in 0 1 0 1; do TSM_INDEXER_HEADS_ALONG_N=$v timeout 150 python3 benchmarks/indexer_bench.py "$OUT/indexer-heads$v.json" 2>&1 | grep -E "^(prefill|decode) |Error" | sed "s/^/[heads_along_n=$v] /"; done ;;
    indexer-heads-tiles) # the heads-along-N indexer's tiles (TSM_INDEXER_HEADS_ALONG_N=1): the prefill rows
      # of the bench for each tile in $HEADS_TILES (";"-separated "COLUMNS,BLOCK_N,WARPS,STAGES"),
      # then the decode rows for each programs-per-SM target in $PAGED_PER_SM, each in its own process
      IFS=';' read -ra tiles <<< "${HEADS_TILES:-256,64,8,3;128,64,4,3}"
      for t in "${tiles[@]}"; do TSM_INDEXER_HEADS_ALONG_N=1 TSM_INDEXER_HEADS_TILE=$t timeout 120 python3 benchmarks/indexer_bench.py "$OUT/heads-tile-${t//,/-}.json" prefill 2>&1 | grep -E "^prefill |Error" | sed "s/^/[tile=$t] /"; done
      for p in ${PAGED_PER_SM:-2 4 8}; do TSM_INDEXER_HEADS_ALONG_N=1 TSM_INDEXER_PAGED_PER_SM=$p timeout 120 python3 benchmarks/indexer_bench.py "$OUT/heads-paged-$p.json" decode 2>&1 | grep -E "^decode |Error" | sed "s/^/[per_sm=$p] /"; done ;;
    indexer-env) # the indexer bench under each environment in $INDEXER_SETS (";"-separated, each a
      # space-separated list of VAR=value, "" for none; e.g. "TSM_INDEXER_PAGED_COLUMNS=128;
      # TSM_INDEXER_PAGED_COLUMNS=64"), each in its own process, the rows of $INDEXER_PHASE
      # (prefill or decode; default both)
      IFS=';' read -ra sets <<< "${INDEXER_SETS:?set INDEXER_SETS, e.g. TSM_INDEXER_PAGED_COLUMNS=64}"
      for v in "${sets[@]}"; do tag=$(echo "$v" | tr -c 'A-Za-z0-9_\n-' '_' | tr -s '_')
        env $v timeout 120 python3 benchmarks/indexer_bench.py "$OUT/indexer-env-$tag.json" ${INDEXER_PHASE:-} 2>&1 | grep -E "^(prefill|decode) |Error" | sed "s/^/[$v] /"; done ;;
    indexer-ncu) # Nsight Compute over the indexer's kernels (benchmarks/indexer_profile.py; workloads
      # from $PROFILE_WORKLOADS), with the source view's SASS
      timeout 300 ncu --clock-control none --profile-from-start off --kernel-name regex:mqa_logits --set full \
           --import-source yes -f -o "$OUT/indexer-prof" python3 benchmarks/indexer_profile.py ${PROFILE_WORKLOADS:-} 2>&1 | tail -5
         ncu --import "$OUT/indexer-prof.ncu-rep" --page details --csv > "$OUT/indexer-ncu-details.csv" 2>&1; grep -c . "$OUT/indexer-ncu-details.csv"
         ncu --import "$OUT/indexer-prof.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$OUT/indexer-ncu-source.csv.gz" ;;
    fp8choice) timeout 420 python3 benchmarks/fp8_prefill_choice.py "$OUT/fp8-prefill-choice.json" ${CHOICE_HEADS:+--heads $CHOICE_HEADS} ${CHOICE_ROWS:+--rows $CHOICE_ROWS} ${CHOICE_SHARDQ:+--shardq} 2>&1 | tee "$OUT/fp8-prefill-choice.log" | grep CHOICE ;;
    residency) timeout 300 python3 benchmarks/residency.py "$OUT/residency.json" ${TOGGLE_FMT:+--fmt $TOGGLE_FMT} 2>&1 | tee "$OUT/residency.log" | grep RES ;;
    residency-toggle) timeout 300 python3 benchmarks/residency.py "$OUT/residency-toggle.json" --toggle "$TOGGLE" ${TOGGLE_FMT:+--fmt $TOGGLE_FMT} 2>&1 | tee "$OUT/residency-toggle.log" | grep RES ;;
    ncu) timeout 300 ncu --clock-control none --profile-from-start off --kernel-name regex:sparse_mla_ \
           --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
           --section SchedulerStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis \
           --section InstructionStats --section SourceCounters -f -o "$OUT/prof" python3 benchmarks/ncu_profile.py ${PROFILE_WORKLOADS:-} 2>&1 | tail -5
         ncu --import "$OUT/prof.ncu-rep" --page details --csv > "$OUT/ncu-details.csv" 2>&1; grep -c . "$OUT/ncu-details.csv"
         ncu --import "$OUT/prof.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$OUT/ncu-source.csv.gz" ;;
    envab) # kernel variants selected by environment variables, one process per setting, in turn
      # (benchmarks/env_ab.py): ENV_AB_SETS="TSM_FLAG=0;TSM_FLAG=1", ENV_AB_WORKLOADS, ENV_AB_ROUNDS,
      # ENV_AB_FIELD (a TileConfig field set on every tile)
      IFS=';' read -ra sets <<< "${ENV_AB_SETS:?set ENV_AB_SETS, e.g. TSM_FLAG=0;TSM_FLAG=1}"
      args=(); for v in "${sets[@]}"; do args+=(--set "$v"); done
      timeout 550 python3 benchmarks/env_ab.py "$OUT/env-ab.jsonl" \
        ${ENV_AB_WORKLOADS:-4096,16,bf16,N=32768 4096,8,bf16,N=32768 128,16,fp8_ds_mla} \
        "${args[@]}" ${ENV_AB_ROUNDS:+--rounds $ENV_AB_ROUNDS} ${ENV_AB_FIELD:+--field $ENV_AB_FIELD} 2>&1 | tee "$OUT/env-ab.log" | grep ENVAB ;;
    patchab) # a patch of src/ ($PATCH, e.g. one kept in benchmarks/results) against the tree: src/
      # copied to /tmp/patched and patched (hunks outside src/, such as the compile test's
      # counts, skipped), the GPU tests of $PATCH_TESTS (a pytest -k expression over
      # tests/test_attention.py) run on it, then env_ab with PYTHONPATH at each tree in turn
      # (ENV_AB_WORKLOADS, ENV_AB_FIELD, ENV_AB_ROUNDS as for envab)
      rm -rf /tmp/patched && mkdir -p /tmp/patched && cp -r src /tmp/patched/ \
        && (cd /tmp/patched && git apply --include='src/*' "$OLDPWD/${PATCH:?set PATCH to a patch of src/}") || exit 1
      patched=$(echo "$PYTHONPATH" | sed "s#$PWD/src#/tmp/patched/src#")
      [ -n "${PATCH_TESTS:-}" ] && PYTHONPATH=$patched timeout -s INT 150 python3 -m pytest -q -x -n 8 -rf -p no:cacheprovider \
        tests/test_attention.py -k "$PATCH_TESTS" 2>&1 | tee "$OUT/patch-tests.log" | tail -8  # (-rf: the failures' names before the count)
      timeout 450 python3 benchmarks/env_ab.py "$OUT/patch-ab.jsonl" \
        ${ENV_AB_WORKLOADS:-4096,16,fp8_ds_mla,N=32768 4096,8,fp8_ds_mla,N=32768} \
        --set "PYTHONPATH=$PYTHONPATH" --set "PYTHONPATH=$patched" ${ENV_AB_ROUNDS:+--rounds $ENV_AB_ROUNDS} \
        ${ENV_AB_FIELD:+--field $ENV_AB_FIELD} 2>&1 | tee "$OUT/patch-ab.log" | grep ENVAB ;;
    narrow) # the few-head Gluon fp8 tile's GPU tests under their own timeout (a wrong mbarrier phase
      # would hang them), then its timings beside the shipped tiles and FlashMLA
      # (the row format in $TOGGLE_FMT if set, e.g. TOGGLE_FMT=bf16)
      timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_attention.py -k "gluon_narrow or gluon_fp8_producer" 2>&1 | tee "$OUT/narrow-tests.log" | tail -3
      grep -q " passed" "$OUT/narrow-tests.log" && ! grep -q "failed\|error" "$OUT/narrow-tests.log" &&
        timeout 300 python3 benchmarks/sweep.py "$OUT/sweep-narrow.json" --narrow ${TOGGLE_FMT:+--fmt $TOGGLE_FMT} 2>&1 | tee "$OUT/sweep-narrow.log" | grep NARROW ;;
    wide) timeout 240 python3 benchmarks/sweep.py "$OUT/sweep-wide.json" --wide 2>&1 | tee "$OUT/sweep-wide.log" | grep EXCH ;;
    racecheck-producer) # the producer-warpgroup kernel per problem, and the minimal warp-specialized kernel beside
      # it (BENCHMARKS.md "The producer warpgroup shipped": where racecheck's reports on it lie)
      timeout 200 compute-sanitizer --tool racecheck --print-limit 4 python3 benchmarks/sanitize_producer.py 2>&1 | tee "$OUT/racecheck-producer.log" | tail -30
      timeout 60 compute-sanitizer --tool racecheck python3 benchmarks/ws_handshake_probe.py 2>&1 | tail -3 ;;
    racecheck) # (the producer kernel's reports in Triton's hand-over to its partitions are expected: each
      # reported site is counted, so that a site elsewhere stands out)
      timeout 300 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_case.py 2>&1 | tee "$OUT/racecheck.log" | tail -8
      grep -oE "access at [^ ]+ in [^ ]+" "$OUT/racecheck.log" | sort | uniq -c ;;
    nbprobe) # racecheck on the alternate-tile kernel's row-max exchange alone, one and two buffers
      # for the joint max (benchmarks/nb_exchange_probe.py; $NB_VARIANTS, default below)
      timeout 240 compute-sanitizer --tool racecheck python3 benchmarks/nb_exchange_probe.py \
        ${NB_VARIANTS:-full,none,2 partial,none,2 full,none,1} 2>&1 | tee "$OUT/nb-probe.log" | grep -v '^=========     ' | tail -40 ;;
    vllmtests) # tests/vllm against the vLLM in .vllm-carry, 0.33.0 or 0.34.0 (vllm_device_setup.sh)
      timeout 400 bash benchmarks/vllm_device_setup.sh python3 -m pytest -q -p no:cacheprovider tests/vllm 2>&1 \
        | tee "$OUT/vllm-tests.log" | tail -8 ;;
    apart) timeout 420 python3 benchmarks/sweep.py "$OUT/sweep-apart.json" --apart 2>&1 | tee "$OUT/sweep-apart.log" | grep APART ;;
    exchange) timeout 300 python3 benchmarks/sweep.py "$OUT/sweep-exchange.json" --exchange 2>&1 | tee "$OUT/sweep-exchange.log" | grep EXCH ;;
    latency) timeout 300 python3 benchmarks/sweep.py "$OUT/sweep-latency.json" --latency 2>&1 | tee "$OUT/sweep-latency.log" | grep LAT ;;
    warps) timeout 300 python3 benchmarks/sweep.py "$OUT/sweep-warps.json" --warps 2>&1 | tee "$OUT/sweep-warps.log" | grep WARPS ;;
    residency-warps) timeout 300 python3 benchmarks/residency.py "$OUT/residency-warps.json" --warps ${TOGGLE_FMT:+--fmt $TOGGLE_FMT} 2>&1 | tee "$OUT/residency-warps.log" | grep RES ;;
    toggle) timeout 420 python3 benchmarks/sweep.py "$OUT/sweep-toggle.json" --toggle "$TOGGLE" ${TOGGLE_FMT:+--fmt $TOGGLE_FMT} ${TOGGLE_HEADS:+--heads $TOGGLE_HEADS} ${TOGGLE_BASE:+--base $TOGGLE_BASE} 2>&1 | tee "$OUT/sweep-toggle.log" | grep TOGGLE ;;
    fp8sweep) timeout 330 python3 benchmarks/sweep.py "$OUT/sweep-fp8.json" --fp8 2>&1 | tee "$OUT/sweep-fp8.log" | grep FP8 ;;
    ppc) # the 64-head bf16 kernels side by side: the forms in $PP_FORMS (default lockstep,shipped), FlashMLA
      # (PP_ALL=1: also 128 heads and split decode)
      timeout 560 python3 benchmarks/pp_compare.py "$OUT/pp-compare.json" ${PP_FORMS:+--forms $PP_FORMS} ${PP_ALL:+--all} ${PP_ARGS:-} 2>&1 | tee "$OUT/pp-compare.log" | grep PPC ;;
    ppncu) # the same kernels under Nsight Compute (decode T=128 over 1M rows, prefill T=4096 over 32K)
      for ph in "decode --t 128 --rows 1048576" "prefill --t 4096 --rows 32768"; do
        tag=${ph%% *}
        timeout 280 ncu --clock-control none --profile-from-start off \
          --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
          --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
          --section InstructionStats --section SourceCounters -f -o "$OUT/pp-$tag" \
          python3 benchmarks/pp_profile.py --phase $ph --flashmla ${PP_FORMS:+--forms $PP_FORMS} 2>&1 | tail -3
        ncu --import "$OUT/pp-$tag.ncu-rep" --page details --csv > "$OUT/pp-$tag-details.csv" 2>&1
        ncu --import "$OUT/pp-$tag.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$OUT/pp-$tag-source.csv.gz"
        rm -f "$OUT/pp-$tag.ncu-rep"
      done ;;
    targets) # the open rows of issues 3 and 4 beside FlashMLA, about 2.5 min: few-head fp8_ds_mla
      # prefill (16 heads, then 8), 64-head bf16 decode, and the few-head fp8_ds_mla decode
      # (16 heads, then 8: fp8_regs since b6e6dbb)
      B="python3 -m triton_sparse_mla.cli bench --no-torch"
      for job in "prefill deepseek-v32-tp8 fp8_ds_mla 16" "prefill glm5-tp8 fp8_ds_mla 8" "decode glm5-tp1 bf16 64" \
                 "decode deepseek-v32-tp8 fp8_ds_mla 16" "decode glm5-tp8 fp8_ds_mla 8"; do
        set -- $job
        # (a JSON each and one file of their progress lines: a call brings 8 files back)
        timeout 200 $B --phase $1 --preset $2 --formats $3 --json "$OUT/targets-$1-$4.json" 2>> "$OUT/targets.err" | tail -8
      done ;;
    bench) timeout 420 python3 -m triton_sparse_mla.cli bench --phase decode --preset ${BENCH_PRESET:-all} ${BENCH_FORMATS:+--formats $BENCH_FORMATS} ${BENCH_NO_TORCH:+--no-torch} --json "$OUT/bench-decode.json" 2> "$OUT/bench-decode.err" | tee "$OUT/bench-decode.log" ;;
    prefill) timeout 560 python3 -m triton_sparse_mla.cli bench --phase prefill --preset ${BENCH_PRESET:-all} ${BENCH_FORMATS:+--formats $BENCH_FORMATS} ${BENCH_NO_TORCH:+--no-torch} --prefill-tokens ${PREFILL_TOKENS:-4096,16384} --json "$OUT/bench-prefill.json" 2> "$OUT/bench-prefill.err" | tee "$OUT/bench-prefill.log" ;;
  esac
done
