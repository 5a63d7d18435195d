set terminal pngcairo size 900,560 noenhanced
set output '/work/main/docs/results/e4-H-100_outer_lr-0.5_outer_momentum-0.8-step.png'
set xlabel 'step'
set ylabel 'validation loss (average model)'
set grid
set key top right
plot '/work/main/docs/results/e4-H-100_outer_lr-0.5_outer_momentum-0.8-step.dat' index 0 with linespoints title 'diloco', '/work/main/docs/results/e4-H-100_outer_lr-0.5_outer_momentum-0.8-step.dat' index 1 with linespoints title 'gasloc-2peer'
