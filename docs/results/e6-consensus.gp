set terminal pngcairo size 900,560 noenhanced
set output 'e6-consensus.png'
set title 'E6: 32 micro workers in one process'
set xlabel 'training step (inner steps)'
set ylabel 'consensus distance (mean squared distance to the average)'
set logscale y
set grid
set key top right
plot 'e6-consensus.dat' index 0 with linespoints title 'gasloc-1peer', 'e6-consensus.dat' index 1 with linespoints title 'gasloc-2peer'
