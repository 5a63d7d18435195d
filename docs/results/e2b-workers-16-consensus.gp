set terminal pngcairo size 900,560 noenhanced
set output 'e2b-workers-16-consensus.png'
set title 'E2b: H = 30 on 16 and 32 workers, GASLoC against DiLoCo [workers=16]'
set xlabel 'training step (inner steps)'
set ylabel 'consensus distance (mean squared distance to the average)'
set logscale y
set grid
set key top right
plot 'e2b-workers-16-consensus.dat' index 0 with linespoints title 'diloco', 'e2b-workers-16-consensus.dat' index 1 with linespoints title 'gasloc-2peer'
