# `launch`: links dtrain_base only, so it starts on a node without CUDA libraries or libtorch.
# The launcher's logic lives in dtrain_launcher (a static library) so tests can link it.
add_library(dtrain_launcher STATIC
  launcher/version.cpp
  launcher/job/launch_args.cpp
  launcher/job/launch_config.cpp
  launcher/cluster/hosts.cpp
  launcher/cluster/scheduler_env.cpp
  launcher/cluster/forwarded_env.cpp
  launcher/cluster/nccl_env.cpp
  launcher/cluster/remote/remote_command.cpp
  launcher/cluster/remote/session.cpp
  launcher/cluster/rendezvous.cpp
  launcher/cluster/coordinator.cpp
  launcher/cluster/coordinator_rendezvous.cpp
  launcher/cluster/coordinator_round.cpp
  launcher/cluster/plan.cpp
  launcher/cluster/plan_codec.cpp
  launcher/cluster/heartbeat_thread.cpp
  launcher/cluster/agent.cpp
  launcher/cluster/master.cpp
  launcher/cluster/fan_out.cpp
  launcher/cluster/multinode.cpp
  launcher/cluster/preflight.cpp
  launcher/job/worker_env.cpp
  launcher/job/program.cpp
  launcher/job/node_probe.cpp
  launcher/job/job.cpp
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
  launcher/monitor/monitor_options.cpp
  launcher/monitor/native_stack.cpp
  launcher/monitor/node_files.cpp
  launcher/monitor/node_sampler.cpp
  launcher/monitor/proc_files.cpp
  launcher/monitor/process_sampler.cpp
  launcher/monitor/records.cpp
  launcher/monitor/stall_detector.cpp
  launcher/monitor/watches.cpp
)
target_include_directories(dtrain_launcher PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
# dtrain_base's internal headers: parse_int.h (one integer rule everywhere) and text.h, which
# launcher headers include too (so `launch` and the launcher's tests see them).
target_include_directories(dtrain_launcher PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/runtime/base)
target_link_libraries(dtrain_launcher PUBLIC dtrain_base
                      PRIVATE nlohmann_json::nlohmann_json ${CMAKE_DL_LIBS})
dtrain_warnings(dtrain_launcher)

add_executable(launch launcher/main.cpp)
target_link_libraries(launch PRIVATE dtrain_launcher)
target_link_options(launch PRIVATE -Wl,-z,now -Wl,-z,relro)
dtrain_warnings(launch)
list(APPEND DTRAIN_INSTALL_TARGETS launch)
