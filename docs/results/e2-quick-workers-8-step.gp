set terminal pngcairo size 900,560 noenhanced
set output '/work/wt/usable/docs/results/e2-quick-workers-8-step.png'
set title 'E2: H = 30, GASLoC against DiLoCo and Local-DAdam [workers=8] (quick mode)'
set xlabel 'training step (inner steps)'
set ylabel 'validation loss (nats per token, average model)'
set grid
set key top right
plot '/work/wt/usable/docs/results/e2-quick-workers-8-step.dat' index 0 with linespoints title 'diloco', '/work/wt/usable/docs/results/e2-quick-workers-8-step.dat' index 1 with linespoints title 'gasloc-2peer', '/work/wt/usable/docs/results/e2-quick-workers-8-step.dat' index 2 with linespoints title 'gasloc-1peer', '/work/wt/usable/docs/results/e2-quick-workers-8-step.dat' index 3 with linespoints title 'local_dadam-2peer', 6.965326744991219 with lines dashtype 2 linecolor 'gray40' title 'unigram baseline (6.965)'
