set terminal pngcairo size 900,560 noenhanced
set output 'hetero-bw1.png'
set xlabel 'virtual time (s)'
set ylabel 'validation loss (average model)'
set grid
set key top right
plot 'hetero-bw1.dat' index 0 with linespoints title 'diloco', 'hetero-bw1.dat' index 1 with linespoints title 'gasloc-1peer-tb', 'hetero-bw1.dat' index 2 with linespoints title 'gasloc-2peer-tb'
