set terminal pngcairo size 900,560 noenhanced
set output 'e11-round-time.png'
set title 'E11: virtual time a round against the number of workers (50 ms, 1 Gbit/s, 134m in bf16, H = 30)'
set xlabel 'workers n (log scale)'
set ylabel 'virtual seconds a round'
set logscale x 2
set xrange [12:1400]
set xtics (16, 64, 256, 1024)
set yrange [14.5:*]
set grid
set key right center
plot 'e11-round-time.dat' index 0 with linespoints title 'diloco (tree all-reduce)', 'e11-round-time.dat' index 1 with linespoints title 'gasloc-1peer', 'e11-round-time.dat' index 2 with linespoints title 'gasloc-2peer', 15 with lines dashtype 2 linecolor 'gray40' title 'the inner steps alone (H x 0.5 s)'
