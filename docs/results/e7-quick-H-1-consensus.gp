set terminal pngcairo size 900,560 noenhanced
set output 'e7-quick-H-1-consensus.png'
set title 'E7: GASLoC forms at H = 1 and H = 30 [H=1] (quick mode)'
set xlabel 'training step (inner steps)'
set ylabel 'consensus distance (mean squared distance to the average)'
set logscale y
set grid
set key top right
plot 'e7-quick-H-1-consensus.dat' index 0 with linespoints title 'anchor', 'e7-quick-H-1-consensus.dat' index 1 with linespoints title 'mix_after', 'e7-quick-H-1-consensus.dat' index 2 with linespoints title 'accelerated'
