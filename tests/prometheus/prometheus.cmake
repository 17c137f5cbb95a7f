# The alert rules (docs/prometheus/dtrain-alerts.yml) checked and unit-tested by Debian's promtool
# -- a test of every alert, GPU ones included, in tests/prometheus/dtrain-alerts-test.yml -- and a
# real Prometheus scraping a running job (prometheus_alerts_test.py). Without the `prometheus`
# package (scripts/setup.sh installs it) each test says so and is skipped (exit 77).
set(_dtrain_rules ${CMAKE_CURRENT_SOURCE_DIR}/docs/prometheus/dtrain-alerts.yml)
set(_dtrain_need_promtool
    "command -v promtool >/dev/null || { echo 'SKIP: promtool is not installed; HINT: scripts/setup.sh installs it (Debian package prometheus)'; exit 77; }")
add_test(NAME prometheus.check_rules
         COMMAND sh -c "${_dtrain_need_promtool}; exec promtool check rules \"$0\"" ${_dtrain_rules})
add_test(NAME prometheus.test_rules
         COMMAND sh -c "${_dtrain_need_promtool}; exec promtool test rules \"$0\""
                 ${CMAKE_CURRENT_SOURCE_DIR}/tests/prometheus/dtrain-alerts-test.yml)
set_tests_properties(prometheus.check_rules prometheus.test_rules
                     PROPERTIES LABELS unit SKIP_RETURN_CODE 77 TIMEOUT 60)

# Every `for:` shortened to 1 s, Prometheus scraping every second: about half a minute, most of
# it waiting on the job's 100 ms steps, so it runs beside other tests (32 s with three busy loops
# on CI's 2 cores as alone).
add_test(NAME prometheus.alerts
         COMMAND ${DTRAIN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/tests/prometheus/prometheus_alerts_test.py
                 ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_BINARY_DIR})
set_tests_properties(prometheus.alerts PROPERTIES LABELS integration SKIP_RETURN_CODE 77
                     TIMEOUT 180)
