"""How fast the dashboard answers its default what-if.

The default what-if (DashboardConfig: 4 policies x (your rate + 6 load
levels), 300 requests per run, SimConfig's scenario) measured four ways:

- cold: the first what-if of a fresh process (starts the worker pool,
  imports simspec and loads the compiled kernels in each worker);
- warm: the same what-if again, nothing cached (what a user waits for after
  changing a widget once the app is up); target: < 5 s on 2 cores;
- cached: the what-if through Streamlit's ``st.cache_data``, a second time;
- page: a whole rerun of the what-if page (AppTest) with the result cached.

Also the warm time in one process (``--workers 0``) and at other request
counts, which is how the default of 300 was chosen. Not a timed test.

    python benchmarks/dashboard_speed.py [--repeat 3] [--requests 200 300 500]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from dataclasses import replace

from simspec import config as configuration
from simspec.cli.dashboard import app_path
from simspec_dashboard import whatif
from simspec_dashboard.whatif import DashboardConfig


def default_config(dash: DashboardConfig) -> configuration.SimConfig:
    return configuration.build(flag_values={"policies": list(dash.policies),
                                            "workload": {"num_requests": dash.num_requests}})


def timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="warm what-ifs to take the median of")
    parser.add_argument("--requests", type=int, nargs="*", default=[200, 500], help="other request counts to time")
    args = parser.parse_args()
    logging.getLogger("streamlit").setLevel(logging.ERROR)  # bare-mode warnings
    import streamlit as st

    dash = DashboardConfig()
    config = default_config(dash)
    runs = 1 + len(dash.loads)
    print(f"default what-if: {len(dash.policies)} policies x {runs} runs ({len(dash.loads)} load levels + your rate), "
          f"{dash.num_requests} requests per run, {dash.workers} worker processes")
    cold = timed(lambda: whatif.what_if(config, dash))
    warm = [timed(lambda: whatif.what_if(config, dash)) for _ in range(args.repeat)]
    moved = timed(lambda: whatif.what_if(replace(config, workload=replace(config.workload, rate_per_s=9.0)), dash))

    cached_what_if = st.cache_data(show_spinner=False)(lambda toml, d: whatif.what_if(
        configuration.build(__import__("tomllib").loads(toml)), d))
    toml = configuration.to_toml(config)
    first = timed(lambda: cached_what_if(toml, dash))
    hit = timed(lambda: cached_what_if(toml, dash))

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(app_path()), default_timeout=300)
    page_first = timed(at.run)
    page_again = timed(at.run)
    assert not at.exception and not at.error, [e.value for e in (*at.exception, *at.error)]

    in_process = timed(lambda: whatif.what_if(config, replace(dash, workers=0)))
    print(f"{'cold (first what-if, starts the pool)':46s} {cold:6.2f} s")
    print(f"{'warm, nothing cached (median of ' + str(args.repeat) + ')':46s} {statistics.median(warm):6.2f} s"
          f"   (all: {', '.join(f'{w:.2f}' for w in warm)}; target < 5 s)")
    print(f"{'warm, another rate (9 req/s)':46s} {moved:6.2f} s")
    print(f"{'warm, in one process (workers 0)':46s} {in_process:6.2f} s")
    print(f"{'st.cache_data: first / hit':46s} {first:6.2f} s / {hit * 1e3:.1f} ms")
    print(f"{'page (AppTest): first run / rerun (cached)':46s} {page_first:6.2f} s / {page_again:.2f} s")
    for n in args.requests:
        d = replace(dash, num_requests=n)
        print(f"{f'warm, {n} requests per run':46s} {timed(lambda: whatif.what_if(default_config(d), d)):6.2f} s")


if __name__ == "__main__":
    main()
