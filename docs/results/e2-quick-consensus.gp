set terminal pngcairo size 900,560 noenhanced
set output 'e2-quick-consensus.png'
set title 'E2: H = 30, GASLoC against DiLoCo and Local-DAdam (quick mode)'
set xlabel 'training step (inner steps)'
set ylabel 'consensus distance (mean squared distance to the average)'
set logscale y
set grid
set key top right
plot 'e2-quick-consensus.dat' index 0 with linespoints title 'diloco', 'e2-quick-consensus.dat' index 1 with linespoints title 'gasloc-2peer', 'e2-quick-consensus.dat' index 2 with linespoints title 'local_dadam-2peer', 'e2-quick-consensus.dat' index 3 with linespoints title 'diloco-untuned'
