set terminal pngcairo size 900,560 noenhanced
set output 'hetero-homogeneous.png'
set xlabel 'virtual time (s)'
set ylabel 'validation loss (average model)'
set grid
set key top right
plot 'hetero-homogeneous.dat' index 0 with linespoints title 'diloco', 'hetero-homogeneous.dat' index 1 with linespoints title 'gasloc-1peer', 'hetero-homogeneous.dat' index 2 with linespoints title 'gasloc-2peer'
