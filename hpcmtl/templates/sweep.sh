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
train={{train}}
test={{test}}
prefix={{prefix}}
lams=({{lams|words}})
n=${#lams[@]}
q() { printf '%q' "$1"; }          # quote once more for the shell that runs each --wrap
array_job=$(sbatch --parsable --job-name={{job_name|raw}} --ntasks={{ntasks|raw}} --time={{time|raw}} \
    --array=0-$((n - 1)) --output=hpcmtl-%A_%a.log --wrap "set -euo pipefail
lams=(${lams[*]})
srun hpcmtl train {{method|raw}} --train $(q "$train") --test $(q "$test") --loss {{loss|raw}} \
    --lam \${lams[\$SLURM_ARRAY_TASK_ID]} --out $(q "$prefix")-\$SLURM_ARRAY_TASK_ID.h5 --force")
sbatch --parsable --job-name={{job_name|raw}}-collect --ntasks=1 --dependency=afterok:"$array_job" \
    --output=hpcmtl-%j.log --wrap "hpcmtl report $(q "$prefix")-*.h5 --out $(q "$prefix")-report --csv"
echo "submitted array job $array_job with $n values of lam and its collection step"
