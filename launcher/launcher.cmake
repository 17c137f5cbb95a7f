# `launch`: links dtrain_base only, so it starts on a node without CUDA libraries or libtorch.
# The launcher's logic lives in dtrain_launcher (a static library) so tests can link it. Its
# folders are its layers (docs/design.md, Layout); tests/scripts/layering_test.py keeps them.
add_library(dtrain_launcher STATIC
  launcher/version.cpp
  # Bottom: what launch was asked to do (pure), then what one node makes of it.
  launcher/config/launch_args.cpp
  launcher/config/launch_config.cpp
  launcher/config/hosts.cpp
  launcher/config/scheduler_env.cpp
  launcher/config/monitor_options.cpp
  launcher/node/program.cpp
  launcher/node/shell_quote.cpp
  launcher/node/worker_env.cpp
  launcher/node/node_probe.cpp
  launcher/node/nccl_env.cpp
  launcher/node/job_resources.cpp
  # Middle: one node's workers (supervisor) and what watches them (monitor).
  launcher/supervisor/guardian.cpp
  launcher/supervisor/output.cpp
  launcher/supervisor/failure_report.cpp
  launcher/supervisor/oom.cpp
  launcher/supervisor/process_info.cpp
  launcher/supervisor/supervisor.cpp
  launcher/supervisor/attempt.cpp
  launcher/supervisor/teardown.cpp
  launcher/monitor/cgroup_memory.cpp
  launcher/monitor/cluster_keys.cpp
  launcher/monitor/command.cpp
  launcher/monitor/gpu_sampler.cpp
  launcher/monitor/job_view.cpp
  launcher/monitor/monitor.cpp
  launcher/monitor/native_stack.cpp
  launcher/monitor/node_figure_options.cpp
  launcher/monitor/node_files.cpp
  launcher/monitor/node_sampler.cpp
  launcher/monitor/proc_files.cpp
  launcher/monitor/process_sampler.cpp
  launcher/monitor/records.cpp
  launcher/monitor/stall_detector.cpp
  launcher/monitor/watches.cpp
  # Top: the one-node job, and the multi-node job (plan, remote, protocol, master, agent).
  launcher/job/job.cpp
  launcher/cluster/plan/plan.cpp
  launcher/cluster/plan/forwarded_env.cpp
  launcher/cluster/remote/remote_command.cpp
  launcher/cluster/remote/session.cpp
  launcher/cluster/protocol/rendezvous.cpp
  launcher/cluster/protocol/plan_codec.cpp
  launcher/cluster/master/coordinator.cpp
  launcher/cluster/master/coordinator_rendezvous.cpp
  launcher/cluster/master/coordinator_round.cpp
  launcher/cluster/master/node_loss.cpp
  launcher/cluster/master/master.cpp
  launcher/cluster/master/fan_out.cpp
  launcher/cluster/agent/heartbeat_thread.cpp
  launcher/cluster/agent/agent.cpp
  launcher/cluster/multinode.cpp
  launcher/cluster/preflight.cpp
)
target_include_directories(dtrain_launcher PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
# dtrain_base's internal headers: parse_int.h (one integer rule everywhere), text.h, which
# launcher headers include too (so `launch` and the launcher's tests see them), and fault.h.
target_include_directories(dtrain_launcher PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/runtime/base)
target_link_libraries(dtrain_launcher PUBLIC dtrain_base
                      PRIVATE nlohmann_json::nlohmann_json ${CMAKE_DL_LIBS})
dtrain_warnings(dtrain_launcher)

add_executable(launch launcher/main.cpp)
target_link_libraries(launch PRIVATE dtrain_launcher)
target_link_options(launch PRIVATE -Wl,-z,now -Wl,-z,relro)
dtrain_warnings(launch)
list(APPEND DTRAIN_INSTALL_TARGETS launch)
