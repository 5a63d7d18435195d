set terminal pngcairo size 900,560 noenhanced
set output '/work/main/docs/results/e2b-workers-16-time.png'
set xlabel 'virtual time (s)'
set ylabel 'validation loss (average model)'
set grid
set key top right
plot '/work/main/docs/results/e2b-workers-16-time.dat' index 0 with linespoints title 'diloco', '/work/main/docs/results/e2b-workers-16-time.dat' index 1 with linespoints title 'gasloc-2peer', '/work/main/docs/results/e2b-workers-16-time.dat' index 2 with linespoints title 'gasloc-1peer', '/work/main/docs/results/e2b-workers-16-time.dat' index 3 with linespoints title 'local_dadam-2peer'
