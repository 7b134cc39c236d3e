#!/bin/bash
# Entrypoint of the idempay-spark image.
#   executor …   a Spark-on-Kubernetes executor pod (the driver starts these with the
#                SPARK_* variables below set); runs Spark's KubernetesExecutorBackend.
#   anything     run as given (spark-submit for the driver, a shell, …).
set -euo pipefail

if [ "${1:-}" != "executor" ]; then
  exec "$@"
fi

# The driver passes executor JVM options as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, … (in order).
java_opts=()
while IFS= read -r name; do
  java_opts+=("${!name}")
done < <(compgen -e | grep -E '^SPARK_JAVA_OPT_[0-9]+$' | sort -t_ -k4 -n)

exec "${JAVA_HOME}/bin/java" \
  "${java_opts[@]}" \
  "-Xms${SPARK_EXECUTOR_MEMORY}" "-Xmx${SPARK_EXECUTOR_MEMORY}" \
  -cp "${SPARK_HOME}/jars/*" \
  org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
  --driver-url "${SPARK_DRIVER_URL}" \
  --executor-id "${SPARK_EXECUTOR_ID}" \
  --cores "${SPARK_EXECUTOR_CORES}" \
  --app-id "${SPARK_APPLICATION_ID}" \
  --hostname "${SPARK_EXECUTOR_POD_IP}" \
  --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID}" \
  --podName "${SPARK_EXECUTOR_POD_NAME}"
