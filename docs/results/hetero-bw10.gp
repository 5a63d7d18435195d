set terminal pngcairo size 900,560 noenhanced
set output 'hetero-bw10.png'
set xlabel 'virtual time (s)'
set ylabel 'validation loss (average model)'
set grid
set key top right
plot 'hetero-bw10.dat' index 0 with linespoints title 'diloco', 'hetero-bw10.dat' index 1 with linespoints title 'gasloc-1peer', 'hetero-bw10.dat' index 2 with linespoints title 'gasloc-1peer-tb', 'hetero-bw10.dat' index 3 with linespoints title 'gasloc-2peer', 'hetero-bw10.dat' index 4 with linespoints title 'gasloc-2peer-tb'
