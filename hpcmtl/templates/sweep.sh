#!/bin/bash
# hpcmtl: a job array sweeping lam, one result file per array index, then a collection step.
#   hpcmtl jobs render sweep --set train=TRAIN.h5 --set test=TEST.h5 --set prefix=results/sweep \
#       --set lams="1e-4 1e-3 1e-2" > sweep.sh && bash sweep.sh
# Submits the array (index i trains with the i-th lam into PREFIX-i.h5) and a collection
# job that runs after all of them succeed: hpcmtl report over every result into PREFIX-report/.
# hpcmtl-param: job_name  hpcmtl-sweep  SLURM job name
# hpcmtl-param: ntasks    5             MPI ranks per array task
# hpcmtl-param: time      01:00:00      wall-clock limit per array task
# hpcmtl-param: method    dmtrl         training method
# hpcmtl-param: train     -             training task file
# hpcmtl-param: test      -             test task file
# hpcmtl-param: prefix    -             result files: PREFIX-0.h5, PREFIX-1.h5, ...
# hpcmtl-param: loss      hinge         loss
# hpcmtl-param: lams      -             the lam values, separated by spaces
set -euo pipefail
lams=({{lams}})
n=${#lams[@]}
# sbatch runs each --wrap command with /bin/sh: the values in it are quoted for that shell
# when the template is rendered, and the '...' around it keeps this script's shell out.
array_job=$(sbatch --parsable --job-name={{job_name|raw}} --ntasks={{ntasks|raw}} --time={{time|raw}} \
    --array=0-$((n - 1)) --output=hpcmtl-%A_%a.log --wrap 'set -eu
set -- {{lams|wrap}}
shift "$SLURM_ARRAY_TASK_ID"
srun hpcmtl train {{method|wrap}} --train={{train|wrap}} --test={{test|wrap}} --loss={{loss|wrap}} \
    --lam="$1" --out={{prefix|wrap}}-"$SLURM_ARRAY_TASK_ID".h5 --force{{train_options|wrap}}')
sbatch --parsable --job-name={{job_name|raw}}-collect --ntasks=1 --dependency=afterok:"$array_job" \
    --output=hpcmtl-%j.log --wrap 'hpcmtl report --out={{prefix|wrap}}-report --csv -- {{prefix|wrap}}-*.h5'
echo "submitted array job $array_job with $n values of lam and its collection step"
