"""The driver of tests/test_ray_elastic.py's job, in a process of its own as a user's
script would be: ``python ray_elastic_driver.py ADDRESS REPORTS``.

Joins the Ray cluster at ADDRESS and runs ray_jobs.torch_elastic in ``shrink`` mode as
an elastic hvdtrain.jobs.ray job (2 to 3 workers, sharded optimizer), the workers appending
their reports to REPORTS; prints ``TOOK seconds``.
"""

import sys
import time

import ray
import ray_jobs

import hvdtrain.jobs.ray


def main() -> None:
    address, reports = sys.argv[1], sys.argv[2]
    ray.init(address=address, logging_level="ERROR")
    started = time.monotonic()
    try:
        hvdtrain.jobs.ray.run(ray_jobs.torch_elastic, min_workers=2, max_workers=3,
                         args=["shrink"], elastic_timeout_s=60, nics=["lo"],
                         env={"HVDTRAIN_TEST_SHARDED": "1", "HVDTRAIN_TEST_REPORTS": reports})
    finally:
        ray.shutdown()
    print(f"TOOK {time.monotonic() - started:.1f}", flush=True)


if __name__ == "__main__":
    main()
